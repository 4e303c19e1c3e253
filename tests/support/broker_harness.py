"""The broker harness of the contract tests: every case runs once on each broker.

- `rabbitmq`: the real RabbitMQ, the inbox on the real PostgreSQL.
- `memory`: the reference broker in memory (shared/broker/memory), the inbox in the reference
  store in memory: the semantics the processes rely on, without a server.

Either way a hub of the test's own, and real consumers that the fixture stops at the end."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import aio_pika
import pytest

from shared.broker.consumer import Consumer, ConsumerPolicy
from shared.broker.memory import MemoryBroker, MemoryConnection
from shared.broker.publisher import Publisher
from shared.broker.rabbitmq.connection import connect, quorum_available
from shared.broker.topology import Names, QueuePolicy, declare_topology, delete_topology
from shared.domain.messages import StepAction, StepOutcome, StepReply
from shared.store.memory import MemoryStore
from shared.store.port import StateStore
from shared.store.postgres import PostgresStore
from tests.conftest import POSTGRES_URL, RABBITMQ_URL, RABBITMQ_USER, service_missing

ORDERS_MAX = 3
LIMIT = 3


@dataclass
class Broker:
    names: Names
    connection: aio_pika.abc.AbstractRobustConnection
    publisher: Publisher
    store: StateStore
    consumers: list[Consumer] = field(default_factory=list)
    kind: str = "rabbitmq"

    async def connect(self, name: str) -> aio_pika.abc.AbstractRobustConnection:
        """Another connection to the same broker, as the same user."""
        if isinstance(self.connection, MemoryConnection):
            return MemoryConnection(self.connection.broker, RABBITMQ_USER, name=name)  # type: ignore[return-value]
        return await connect(RABBITMQ_URL, timeout=5, name=name)

    async def consume(
        self, queue: str, handler, *, dead_letters=None, store=None, along=None, **policy
    ) -> Consumer:
        channel = await self.connection.channel()
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
            channel=channel,
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

    async def dead_letters(self, queue: str) -> list[aio_pika.abc.AbstractIncomingMessage]:
        channel = await self.connection.channel()
        dlq = await channel.get_queue(self.names.dlq(queue))
        got = []
        while (message := await dlq.get(no_ack=True, fail=False)) is not None:
            got.append(message)
        await channel.close()
        return got


BROKER_KINDS = [
    pytest.param("rabbitmq", marks=[pytest.mark.rabbitmq, pytest.mark.postgres], id="rabbitmq"),
    pytest.param("memory", marks=pytest.mark.memory, id="memory"),
]


async def _open(kind: str, hub: str) -> tuple[aio_pika.abc.AbstractRobustConnection, StateStore]:
    if kind == "memory":
        connection: Any = MemoryConnection(MemoryBroker(), RABBITMQ_USER, name="contract-tests")
        return connection, MemoryStore()
    try:
        connection = await connect(RABBITMQ_URL, timeout=5, name="contract-tests")
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
        quorum=quorum_available(connection), delivery_limit=LIMIT, orders_max_length=ORDERS_MAX
    )
    channel = await connection.channel()
    await declare_topology(channel, names, policy)
    publisher = await Publisher.open(connection, timeout=5)
    b = Broker(names, connection, publisher, store, kind=request.param)
    try:
        yield b
    finally:
        for consumer in b.consumers:
            await consumer.stop(drain_timeout=2)
        await delete_topology(channel, names)
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
