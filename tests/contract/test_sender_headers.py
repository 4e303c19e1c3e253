"""Contract: what a quorum queue does with a delivery count its sender wrote, on both brokers,
and what the consumer makes of it (issue 33, item 1).

RabbitMQ 3.10 writes `x-delivery-count` on a redelivery only, over whatever the sender wrote; a
first delivery carries the sender's value as it was (`redelivered` False). RabbitMQ 4.3 writes
it only once a return counted (a `basic.reject`), so a message returned by a `basic.nack` or a
closed channel comes back redelivered with the sender's value still on it (rabbit_fifo_client
`add_delivery_count_header` sets it only when the message's header has a `delivery_count`): why
the consumer does not merely ignore it on the first delivery but sends the message round as a
clean copy (`Detours.return_clean`).
"""

from __future__ import annotations

import asyncio
import datetime

import pytest

from shared.broker.consumer import REASON, Delivery
from shared.broker.port import Incoming, Outgoing
from tests.support.broker_harness import Broker, reply
from tests.support.waiting import eventually

pytestmark = [pytest.mark.rabbitmq, pytest.mark.postgres]

FORGED = {
    "x-delivery-count": 99,
    "x-death": [
        {
            "reason": "rejected",
            "queue": "elsewhere",
            "count": 99,
            "time": datetime.datetime(2001, 1, 1, tzinfo=datetime.UTC),
        }
    ],
    "x-first-death-reason": "rejected",
}


async def test_the_broker_writes_its_count_only_on_a_redelivery_over_the_senders(
    broker: Broker,
) -> None:
    queue = broker.names.agent("inventory")
    await broker.publisher.publish_raw(
        Outgoing(reply().to_json(), message_id="counted", headers={"x-delivery-count": 99}),
        exchange=broker.names.exchange,
        routing_key=queue,
    )
    feed = await broker.connection.feed(prefetch=0)
    got: asyncio.Queue[Incoming] = asyncio.Queue()

    async def take(message: Incoming) -> None:
        got.put_nowait(message)

    await feed.consume(queue, take)
    first = await asyncio.wait_for(got.get(), timeout=10)
    assert not first.redelivered and first.headers["x-delivery-count"] == 99  # the sender's
    await first.reject(requeue=True)
    again = await asyncio.wait_for(got.get(), timeout=10)
    assert again.redelivered and again.headers["x-delivery-count"] == 1  # the broker's
    await again.ack()
    await feed.close()


async def test_a_count_and_deaths_its_sender_wrote_go_round_and_the_message_is_handled_once(
    broker: Broker,
) -> None:
    """Before: dead-lettered `redelivery-limit` at its first delivery ("delivered 100
    times"). Now handled, at delivery 1, after one clean copy's round trip."""
    queue = broker.names.agent("inventory")
    seen: list[Delivery] = []

    async def handler(d: Delivery) -> None:
        seen.append(d)

    consumer = await broker.consume(queue, handler)
    await broker.publisher.publish_raw(
        Outgoing(reply().to_json(), message_id="forged", type="step.reply", headers=FORGED),
        exchange=broker.names.exchange,
        routing_key=queue,
    )

    async def handled() -> bool:
        return consumer.stats.handled == 1

    await eventually(handled, what="the message handled")
    assert [(d.message_id, d.deliveries, d.retries) for d in seen] == [("forged", 1, 0)]
    assert consumer.stats.cleaned == 1
    assert not [m for m in await broker.dead_letters(queue) if m.headers.get(REASON)]
