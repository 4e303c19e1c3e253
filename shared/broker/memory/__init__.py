"""The reference broker in memory (server.py) and its aio-pika-shaped clients (client.py)."""

from shared.broker.memory.client import MemoryChannel, MemoryConnection, connect
from shared.broker.memory.server import MemoryBroker, Network

__all__ = ["MemoryBroker", "MemoryChannel", "MemoryConnection", "Network", "connect"]
