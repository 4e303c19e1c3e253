"""The reference broker in memory (server.py) and its aio-pika-shaped clients (client.py)."""

from shared.broker.memory.client import MemoryChannel, MemoryConnection, connect
from shared.broker.memory.objects import Network
from shared.broker.memory.server import MemoryBroker

__all__ = ["MemoryBroker", "MemoryChannel", "MemoryConnection", "Network", "connect"]
