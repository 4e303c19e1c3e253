"""The fixture of the broker port's contract suite: every case runs once on each adapter of
shared/broker/port.py, through the port alone.

- `rabbitmq`: shared/broker/rabbitmq's `connect`, on the real RabbitMQ;
- `memory`: shared/broker/memory's `connect` (the memory adapter), on a `MemoryBroker` of the
  test's own.

A case names what it declares with its own prefix and
declares it through `Port.exchange` and `Port.queue`, which remember it: the fixture deletes
every one at the end through a connection of its own, so a case that closed its connection or
failed half-way leaves nothing behind on the shared RabbitMQ.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import strategies as st

from shared.broker import memory, rabbitmq
from shared.broker.port import (
    Arguments,
    Connection,
    ExchangeKind,
    Feed,
    Incoming,
    Outgoing,
    QueueAdmin,
    Sender,
)
from shared.errors import ServiceUnavailable
from tests.conftest import RABBITMQ_URL, RABBITMQ_USER, service_missing
from tests.support.waiting import eventually

PORT_KINDS = [
    pytest.param("rabbitmq", marks=pytest.mark.rabbitmq, id="rabbitmq"),
    pytest.param("memory", marks=pytest.mark.memory, id="memory"),
]

Opener = Callable[[str], Awaitable[Connection]]
Nemesis = Callable[[Connection], Awaitable[None]]


@dataclass
class Port:
    """One adapter under test: a connection, its admin, and what the case declared."""

    kind: str
    connection: Connection
    admin: QueueAdmin
    prefix: str
    open: Opener
    """Another connection to the same broker, as the same user."""
    lose: Nemesis
    """Drop a connection as the broker's going away would: the adapter restores it."""
    queues: list[str] = field(default_factory=list)
    exchanges: list[str] = field(default_factory=list)
    others: list[Connection] = field(default_factory=list)

    def name(self, label: str) -> str:
        """A name no other test uses: the test's prefix, then `label`."""
        return f"{self.prefix}.{label}"

    def remember(self, name: str, *, exchange: bool = False) -> str:
        """Delete `name` at the end (queues before exchanges)."""
        held = self.exchanges if exchange else self.queues
        if name not in held:
            held.append(name)
        return name

    async def connect(self, label: str) -> Connection:
        """Another connection to the same broker, closed at the end."""
        other = await self.open(f"port-contract-{label}")
        self.others.append(other)
        return other

    async def exchange(self, label: str, kind: ExchangeKind = ExchangeKind.DIRECT) -> str:
        name = self.remember(self.name(label), exchange=True)
        await self.admin.declare_exchange(name, kind)
        return name

    async def queue(
        self,
        label: str,
        *,
        arguments: Arguments | None = None,
        durable: bool = True,
        exclusive: bool = False,
        auto_delete: bool = False,
    ) -> str:
        name = self.remember(self.name(label))
        await self.admin.declare_queue(
            name,
            arguments=arguments,
            durable=durable,
            exclusive=exclusive,
            auto_delete=auto_delete,
        )
        return name

    async def routed_queue(
        self, label: str, *, arguments: Arguments | None = None
    ) -> tuple[str, str]:
        """A direct exchange and a queue bound to it by the queue's name: (exchange, queue)."""
        exchange = await self.exchange(f"{label}.x")
        queue = await self.queue(label, arguments=arguments)
        await self.admin.bind(queue, exchange, routing_key=queue)
        return exchange, queue

    async def dead_letters(self, label: str) -> tuple[str, str]:
        """A fanout dead-letter exchange and the queue that takes everything it gets."""
        exchange = await self.exchange(f"{label}.dlx", ExchangeKind.FANOUT)
        queue = await self.queue(f"{label}.dlq")
        await self.admin.bind(queue, exchange)
        return exchange, queue


class Inbox:
    """What a feed delivered, in order of arrival, awaited with a deadline."""

    def __init__(self) -> None:
        self.got: list[Incoming] = []
        self._arrived: asyncio.Queue[Incoming] = asyncio.Queue()

    async def take(self, message: Incoming) -> None:
        self.got.append(message)
        self._arrived.put_nowait(message)

    async def next(self, timeout: float = 10.0) -> Incoming:
        return await asyncio.wait_for(self._arrived.get(), timeout)

    def waiting(self) -> int:
        """Delivered and not yet taken by `next`."""
        return self._arrived.qsize()


async def send(
    sender: Sender, exchange: str, routing_key: str, message_id: str | None = None, **fields: Any
) -> str:
    """Publish a small message (confirmed on return): its message id."""
    message_id = message_id or uuid.uuid4().hex
    message = Outgoing(body=b"{}", message_id=message_id, **fields)
    await sender.publish(message, exchange=exchange, routing_key=routing_key)
    return message_id


async def depth_becomes(admin: QueueAdmin, queue: str, count: int) -> None:
    async def reached() -> bool:
        return await admin.depth(queue) == count

    await eventually(reached, what=f"{count} ready in {queue}")


async def taken(feed: Feed, queue: str) -> Incoming:
    """The next message of `queue` by `get`, waited for (dead-lettering and requeues are
    asynchronous on RabbitMQ)."""
    return await eventually(lambda: feed.get(queue), what=f"a message in {queue}")


def exactly(value: Any) -> Any:
    """`value` with the type of every leaf beside it: `True == 1` and `[1] == (1,)` are no
    round trip."""
    if isinstance(value, Mapping):
        return ("map", {key: exactly(item) for key, item in value.items()})
    if isinstance(value, list):
        return ("list", [exactly(item) for item in value])
    return (type(value).__name__, value)


def as_utc(moment: datetime | None) -> datetime | None:
    """AMQP carries whole seconds and no zone: a naive timestamp read back is UTC."""
    if moment is None or moment.tzinfo is not None:
        return moment
    return moment.replace(tzinfo=UTC)


def channel_gone(delivery: Incoming) -> bool:
    """Whether `delivery.channel` raises (the port names no type: any will do)."""
    try:
        _ = delivery.channel
    except Exception:
        return True
    return False


HEADER_KEYS = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789_", min_size=1, max_size=12)
HEADER_SCALARS = st.one_of(st.text(max_size=16), st.integers(-(2**63), 2**63 - 1), st.booleans())
HEADER_VALUES = st.recursive(
    HEADER_SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(HEADER_KEYS, inner, max_size=4)
    ),
    max_leaves=10,
)
HEADERS = st.dictionaries(HEADER_KEYS, HEADER_VALUES, max_size=5)
"""Headers of nested str/int/bool/list/dict, as AMQP's field tables carry them."""


def _adapter(kind: str) -> tuple[Opener, Nemesis]:
    if kind == "memory":
        return _memory(memory.MemoryBroker())
    return _rabbitmq()


def _memory(broker: memory.MemoryBroker) -> tuple[Opener, Nemesis]:
    """Connections to one memory broker (the test's own), and its outage."""

    async def open_memory(name: str) -> Connection:
        return memory.connect(broker, RABBITMQ_USER, name=name)

    async def outage(connection: Connection) -> None:
        broker.outage(True)
        broker.outage(False)

    return open_memory, outage


def _rabbitmq() -> tuple[Opener, Nemesis]:
    async def open_rabbitmq(name: str) -> Connection:
        try:
            return await rabbitmq.connect(RABBITMQ_URL, timeout=5, name=name)
        except (ServiceUnavailable, OSError) as exc:
            service_missing("RabbitMQ", exc)
            raise

    async def node_lost(connection: Connection) -> None:
        """Its socket closed under it, as when its node dies (as in test_broker_failover.py:
        the one place these cases reach below the port, into the adapter's aio-pika)."""
        robust = connection._connection  # type: ignore[attr-defined]
        await robust.transport.connection.close(ConnectionError("node lost (test)"))

    return open_rabbitmq, node_lost


async def _clean(port: Port) -> None:
    """Delete what the case declared, through a connection of its own; every one is tried."""
    cleaner = await port.open("port-contract-cleanup")
    admin = await cleaner.admin()
    failures: list[BaseException] = []
    for name, is_exchange in [(q, False) for q in port.queues] + [
        (x, True) for x in port.exchanges
    ]:
        try:
            await admin.delete(name, exchange=is_exchange)
        except Exception as exc:
            failures.append(exc)
    await cleaner.close()
    if failures:
        raise failures[0]


@pytest.fixture(params=PORT_KINDS)
async def port(request: pytest.FixtureRequest) -> AsyncIterator[Port]:
    open_, lose = _adapter(request.param)
    connection = await open_("port-contract")
    admin = await connection.admin()
    p = Port(request.param, connection, admin, f"port-{uuid.uuid4().hex[:12]}", open_, lose)
    try:
        yield p
    finally:
        for other in p.others:
            await other.close()
        await connection.close()
        await _clean(p)
