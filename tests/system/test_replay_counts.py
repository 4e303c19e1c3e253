"""A dead letter replayed starts its delivery count afresh: a message the quorum queue itself
dead-lettered at its delivery limit carries the broker's `x-death`, and in the DLQ an
`x-delivery-count` of the DLQ's own that grows with every look an operator takes; were they
carried back into the source queue the consumer would dead-letter the replay at once as
`redelivery-limit`, before handling it (real RabbitMQ, real processes)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aio_pika
import pytest

from shared.broker.rabbitmq.connection import connect
from shared.broker.topology import Names
from shared.domain.messages import SubmitOrder
from shared.domain.states import ProcessState
from tests.conftest import RABBITMQ_URL, RABBITMQ_USER
from tests.support.factories import order_data
from tests.support.topology import Topology, running_topology
from tests.support.waiting import eventually

pytestmark = [pytest.mark.rabbitmq, pytest.mark.postgres]


@pytest.fixture
async def topo(hub: str, tmp_path: Path) -> AsyncIterator[Topology]:
    async with running_topology(hub, tmp_path) as t:
        yield t


async def _rejected_until_dead(channel: aio_pika.abc.AbstractChannel, queue: str) -> int:
    """Take the queue's message and `basic.reject` it back, as a consumer that dies on it every
    time would, until the quorum queue dead-letters it; the rejections it took."""
    source = await channel.get_queue(queue)
    rejected = 0
    while True:

        async def delivered() -> aio_pika.abc.AbstractIncomingMessage | None:
            got: aio_pika.abc.AbstractIncomingMessage | None = await source.get(
                no_ack=False, fail=False
            )
            return got

        try:
            message = await eventually(delivered, timeout=2, interval=0.05, what="a delivery")
        except AssertionError:
            return rejected  # gone: the broker dead-lettered it
        await message.reject(requeue=True)
        rejected += 1


async def test_a_message_the_quorum_queue_dead_lettered_is_replayed_with_a_fresh_count(
    topo: Topology,
) -> None:
    names = Names(topo.hub)
    connection = await connect(RABBITMQ_URL, timeout=5, name="replay-count-test")
    try:
        channel = await connection.channel()
        body = SubmitOrder(order=order_data("o-dead")).to_json()
        submit = await channel.get_exchange(names.submit)
        await submit.publish(
            aio_pika.Message(
                body,
                message_id="order:o-dead:1",
                type="order.submit",
                content_type="application/json",
                user_id=RABBITMQ_USER,
                delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
            ),
            routing_key="",
        )
        rejected = await _rejected_until_dead(channel, names.orders)
        limit = int(topo.env.get("ORDERFLOW_REDELIVERY_LIMIT", "5"))
        # The queue's `x-delivery-limit` is one above the consumer's limit; it dead-letters the
        # delivery past it.
        assert rejected == limit + 2
        dlq = await channel.get_queue(names.dlq(names.orders))

        async def dead() -> aio_pika.abc.AbstractIncomingMessage | None:
            got: aio_pika.abc.AbstractIncomingMessage | None = await dlq.get(
                no_ack=False, fail=False
            )
            return got

        letter = await eventually(dead, timeout=10, what="the broker's dead letter")
        headers: dict[str, Any] = dict(letter.headers or {})
        [death] = headers["x-death"]
        assert death["reason"] == "delivery_limit" and death["queue"] == names.orders
        # Its count in the DLQ (a quorum queue too) is the DLQ's own: each look at it by
        # `orderflow dlq list` returns it there, and is counted.
        await letter.nack(requeue=True)  # left for the operator
        for _ in range(3):
            assert topo.cli("dlq", "list").returncode == 0

        # One user for all (as here): the operator may replay what the broker dead-lettered.
        replayed = topo.cli("dlq", "replay", "order:o-dead:1", "--json")
        assert replayed.returncode == 0, replayed.stderr
        await topo.start_all()

        async def processed() -> bool:
            state = await topo.store.get_state("o-dead")
            return state is not None and state.process_state is ProcessState.PROCESSED

        await eventually(processed, timeout=30, what="the replayed order Processed")
        assert "redelivery-limit" not in topo.logs("submission")
        rows = topo.cli("dlq", "list", "--json")
        assert '"messages": []' in rows.stdout, rows.stdout
    finally:
        await connection.close()
