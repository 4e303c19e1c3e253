"""The reference broker in memory (server.py) and its client, the memory adapter of the broker
port (adapter.py, channels.py)."""

from shared.broker.memory.adapter import MemoryConnection, connect
from shared.broker.memory.objects import Network
from shared.broker.memory.server import MemoryBroker

__all__ = ["MemoryBroker", "MemoryConnection", "Network", "connect"]
