"""What only the memory broker does, beside the broker contract suite it passes with RabbitMQ:
outages, severed connections and the simulated wire (shared/broker/memory)."""

from __future__ import annotations

import asyncio
from typing import Any

import aio_pika
import aiormq.exceptions
import pytest
from aio_pika.abc import AbstractIncomingMessage

from harness.simulation import loop as virtual
from shared.broker.memory import MemoryBroker, connect

QUEUE = "q"


async def _queue(broker: MemoryBroker, **arguments: Any) -> Any:
    connection = connect(broker, "u")
    channel = await connection.channel()
    await channel.declare_queue(QUEUE, durable=True, arguments=arguments or None)
    return connection


async def _send(connection: Any, body: bytes, **properties: Any) -> None:
    channel = await connection.channel()
    await channel.default_exchange.publish(aio_pika.Message(body, **properties), QUEUE)


async def _consumer(connection: Any) -> list[AbstractIncomingMessage]:
    got: list[AbstractIncomingMessage] = []
    channel = await connection.channel()

    async def take(message: AbstractIncomingMessage) -> None:
        got.append(message)

    queue = await channel.get_queue(QUEUE)
    await queue.consume(take)
    return got


def test_an_outage_returns_what_consumers_held_and_delivery_resumes_after_it() -> None:
    async def main() -> None:
        broker = MemoryBroker()
        connection = await _queue(broker, **{"x-queue-type": "quorum"})
        got = await _consumer(connection)
        await _send(connection, b"one")
        await asyncio.sleep(0.01)
        assert len(got) == 1 and not got[0].redelivered
        broker.outage(True)
        assert not connection.connected.is_set()
        with pytest.raises(aiormq.exceptions.ChannelInvalidStateError):
            await got[0].ack()  # its channel went with the outage
        with pytest.raises(aiormq.exceptions.ChannelInvalidStateError):
            await _send(connection, b"two")
        await asyncio.sleep(1)
        assert len(got) == 1, "nothing is delivered while the broker is out"
        broker.outage(False)
        await asyncio.sleep(0.01)
        assert len(got) == 2 and got[1].redelivered
        assert got[1].headers["x-delivery-count"] == 1
        await got[1].ack()

    virtual.run(main())


def test_a_severed_connection_returns_its_deliveries_and_loses_its_exclusive_queues() -> None:
    async def main() -> None:
        broker = MemoryBroker()
        connection = await _queue(broker)
        mine = await (await connection.channel()).declare_queue("mine", exclusive=True)
        got = await _consumer(connection)
        await _send(connection, b"one")
        await asyncio.sleep(0.01)
        connection.sever()
        assert mine.name not in broker.queues
        assert [m.redelivered for m in broker.queues[QUEUE].ready] == [True]
        other = connect(broker, "u")
        again = await _consumer(other)
        await asyncio.sleep(0.01)
        assert len(got) == 1 and [m.body for m in again] == [b"one"]

    virtual.run(main())


class _Wire:
    def __init__(self, delays: list[float], twice: bool = False) -> None:
        self.delays = delays
        self.twice = twice

    def delay(self, queue: str, sender: str) -> float:
        return self.delays.pop(0)

    def duplicate(self, queue: str, sender: str) -> bool:
        return self.twice


def test_the_wire_reorders_late_messages_and_delivers_duplicates() -> None:
    async def main() -> None:
        broker = MemoryBroker(_Wire([0.5, 0.0, 0.0], twice=False))
        connection = await _queue(broker)
        got = await _consumer(connection)
        for body in (b"first", b"second"):
            await _send(connection, body)
        await asyncio.sleep(1)
        assert [m.body for m in got] == [b"second", b"first"]
        broker.network = _Wire([0.0], twice=True)
        await _send(connection, b"third")
        await asyncio.sleep(0.01)
        assert [m.body for m in got[2:]] == [b"third", b"third"]

    virtual.run(main())
