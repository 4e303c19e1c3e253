"""The broker harness of the contract tests: every case runs once on each broker.

- `rabbitmq`: the real RabbitMQ through its adapter of the broker port, the inbox on the real
  PostgreSQL.
- `memory`: the reference broker in memory (shared/broker/memory) through its adapter, the inbox
  in the reference store in memory: the semantics the processes rely on, without a server.

Either way a hub of the test's own, and real consumers that the fixture stops at the end. The
runtime code sees only the port (`Broker.connection`); a test that must reach below it (odd
properties, a raw publish) uses `Broker.raw` on RabbitMQ or the broker model on memory."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import aio_pika
import pytest

from shared.broker import memory, rabbitmq
from shared.broker.consumer import Consumer, ConsumerPolicy
from shared.broker.memory import MemoryBroker, MemoryConnection
from shared.broker.memory.objects import Properties, encode
from shared.broker.port import Connection, Incoming
from shared.broker.publisher import Publisher
from shared.broker.rabbitmq.connection import connect as connect_raw
from shared.broker.topology import (
    Names,
    QueuePolicy,
    declare_topology,
    delete_topology,
    supports_quorum,
)
from shared.domain.messages import StepAction, StepOutcome, StepReply
from shared.store.memory import MemoryStore
from shared.store.port import StateStore
from shared.store.postgres import PostgresStore
from tests.conftest import POSTGRES_URL, RABBITMQ_URL, RABBITMQ_USER, service_missing
from tests.support.wire_bytes import raw_bytes_on_the_wire

ORDERS_MAX = 3
LIMIT = 3


@dataclass
class Broker:
    names: Names
    connection: Connection
    publisher: Publisher
    store: StateStore
    consumers: list[Consumer] = field(default_factory=list)
    kind: str = "rabbitmq"
    others: list[Any] = field(default_factory=list)
    """Connections the test opened through the harness, closed at the end."""
    _raw: aio_pika.abc.AbstractRobustConnection | None = None
    """The aio-pika connection `publish_below` publishes on (RabbitMQ)."""

    @property
    def model(self) -> MemoryBroker:
        """The memory broker itself (its own API: properties the port cannot express)."""
        assert isinstance(self.connection, MemoryConnection), "a memory-only step"
        return self.connection.broker

    async def connect(self, name: str) -> Connection:
        """Another connection to the same broker, as the same user (the test closes it)."""
        if isinstance(self.connection, MemoryConnection):
            return memory.connect(self.connection.broker, RABBITMQ_USER, name=name)
        return await rabbitmq.connect(RABBITMQ_URL, timeout=5, name=name)

    async def raw(self, name: str = "contract-tests-raw") -> aio_pika.abc.AbstractRobustConnection:
        """An aio-pika connection to the real RabbitMQ, to poke it below the port; closed at
        the end."""
        assert self.kind == "rabbitmq", "a RabbitMQ-only step"
        connection = await connect_raw(RABBITMQ_URL, timeout=5, name=name)
        self.others.append(connection)
        return connection

    async def publish_below(
        self, exchange: str, routing_key: str, body: bytes, properties: Properties
    ) -> None:
        """Publish what the port cannot express (bytes where AMQP has strings, a timestamp past
        the year 9999: tests/support/wire_bytes.py) as any other AMQP client can: on RabbitMQ
        below aio-pika, on memory through the broker model's own publish (its encoded header),
        as the connection's user."""
        with raw_bytes_on_the_wire():
            if isinstance(self.connection, MemoryConnection):
                header = encode(properties, len(body))
                self.model.publish_as(RABBITMQ_USER, exchange, routing_key, body, header)
                return
            if self._raw is None:
                self._raw = await self.raw()
            channel = await self._raw.channel()
            underlay = await channel.get_underlay_channel()
            await underlay.basic_publish(
                body, exchange=exchange, routing_key=routing_key, properties=properties
            )
            await channel.close()

    async def consume(
        self, queue: str, handler, *, dead_letters=None, store=None, along=None, **policy
    ) -> Consumer:
        defaults = {
            "prefetch": 10,
            "redelivery_limit": LIMIT,
            "max_message_bytes": 4096,
            "dedupe_window": timedelta(hours=1),
            "claim_ttl": timedelta(seconds=5),
            "handler_timeout": 5.0,
            "delayed_retries": LIMIT,
            "retry_delay": 0.2,
            "own_user": RABBITMQ_USER,
        }
        consumer = Consumer(
            connection=self.connection,
            queue=queue,
            names=self.names,
            handler=handler,
            store=store or self.store,
            dead_letter_publisher=dead_letters or self.publisher,
            policy=ConsumerPolicy(**(defaults | policy)),
            holder=f"test-{uuid.uuid4().hex[:6]}",
            along=along,
        )
        await consumer.start()
        self.consumers.append(consumer)
        return consumer

    async def dead_letters(self, queue: str) -> list[Incoming]:
        """Take every message of `queue`'s dead-letter queue (acked: gone from it)."""
        return await self.take_all(self.names.dlq(queue))

    async def take_all(self, queue: str) -> list[Incoming]:
        """Take every message ready in `queue` (acked: gone from it)."""
        feed = await self.connection.feed(prefetch=0)
        got = []
        try:
            while (message := await feed.get(queue)) is not None:
                await message.ack()
                got.append(message)
        finally:
            await feed.close()
        return got

    async def depth(self, queue: str) -> int:
        admin = await self.connection.admin()
        try:
            return await admin.depth(queue)
        finally:
            await admin.close()


BROKER_KINDS = [
    pytest.param("rabbitmq", marks=[pytest.mark.rabbitmq, pytest.mark.postgres], id="rabbitmq"),
    pytest.param("memory", marks=pytest.mark.memory, id="memory"),
]


async def _open(kind: str, hub: str) -> tuple[Connection, StateStore]:
    if kind == "memory":
        return memory.connect(MemoryBroker(), RABBITMQ_USER, name="contract-tests"), MemoryStore()
    try:
        connection = await rabbitmq.connect(RABBITMQ_URL, timeout=5, name="contract-tests")
    except Exception as exc:
        service_missing("RabbitMQ", exc)
    try:
        store = await PostgresStore.connect(
            POSTGRES_URL, hub, pool_size=5, timeout=5, command_timeout=10
        )
    except Exception as exc:
        await connection.close()
        service_missing("PostgreSQL", exc)
    return connection, store


@pytest.fixture(params=BROKER_KINDS)
async def broker(request: pytest.FixtureRequest, hub: str) -> AsyncIterator[Broker]:
    connection, store = await _open(request.param, hub)
    await store.init()
    names = Names(hub)
    policy = QueuePolicy(
        quorum=supports_quorum(connection.info.version),
        delivery_limit=LIMIT,
        orders_max_length=ORDERS_MAX,
    )
    admin = await connection.admin()
    await declare_topology(admin, names, policy)
    publisher = await Publisher.open(connection, timeout=5)
    b = Broker(names, connection, publisher, store, kind=request.param)
    try:
        yield b
    finally:
        for consumer in b.consumers:
            await consumer.stop(drain_timeout=2)
        await delete_topology(admin, names)
        for other in b.others:
            await other.close()
        await store.drop()
        await store.close()
        await connection.close()


def reply(order_id: str = "o-1") -> StepReply:
    return StepReply(
        order_id=order_id,
        step="reserve",
        action=StepAction.DO,
        fencing_token=f"{order_id}:1",
        idempotency_key=f"{order_id}:reserve",
        outcome=StepOutcome.OK,
        attempts_used=1,
    )


async def send(b: Broker, queue: str, contract=None, *, message_id: str | None = None) -> str:
    message_id = message_id or uuid.uuid4().hex
    await b.publisher.publish(
        contract or reply(), exchange=b.names.exchange, routing_key=queue, message_id=message_id
    )
    return message_id
