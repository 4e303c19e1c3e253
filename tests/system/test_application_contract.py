"""The application contract (docs/reference/application-contract.md) as an application written
from it in another language would follow it: raw AMQP (aio-pika here, standing in for amqplib),
none of orderflow's code on the application's side. Real processes, PostgreSQL and RabbitMQ.

The status queue is where applications go wrong: its exact declaration was not written down,
and one declared with another `x-expires` got no status at all (submission's declaration of it
failed, and only submission's log said so). Now a queue that differs only in how long it and
its messages last is bound as it is; one that could send our statuses on (dead-lettering) is
still refused, and its order is processed all the same."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aio_pika
import pytest

from shared.broker.topology import Names
from shared.domain.states import ProcessState
from tests.conftest import RABBITMQ_URL
from tests.support.factories import order_data
from tests.support.topology import Topology, running_topology
from tests.support.waiting import eventually

pytestmark = [pytest.mark.rabbitmq, pytest.mark.postgres]

USER = "guest"
"""The application's broker user (the tests' one user for all): its `user_id` and the third
part of its status queues' names."""

DECLARED: dict[str, dict[str, Any] | None] = {
    "x-expires-600000": {"durable": True, "arguments": {"x-expires": 600_000}},
    "plain-durable": {"durable": True},
    "auto-delete-classic": {
        "durable": False,
        "auto_delete": True,
        "arguments": {"x-expires": 900_000, "x-queue-type": "classic", "x-max-length": 100},
    },
    "exact": {"durable": True, "arguments": {"x-expires": 300_000}},
    "not-declared": None,
}
"""How each application declared its status queue before its first order (None: not at all,
as the contract asks)."""


@pytest.fixture
async def topo(hub: str, tmp_path: Path) -> AsyncIterator[Topology]:
    async with running_topology(hub, tmp_path) as t:
        yield t


@pytest.fixture
async def app(topo: Topology) -> AsyncIterator[aio_pika.abc.AbstractConnection]:
    """The application's connection; every status queue of the hub deleted afterwards (one
    declared without `x-expires` would stay for good)."""
    connection = await aio_pika.connect(RABBITMQ_URL)
    try:
        yield connection
    finally:
        channel = await connection.channel()
        for tag in [*DECLARED, "dead-lettering"]:
            await channel.queue_delete(f"{Names(topo.hub).status_prefix(USER)}{tag}")
        await connection.close()


async def publish_order(
    channel: aio_pika.abc.AbstractChannel, names: Names, order_id: str, reply_to: str
) -> None:
    """An order as the contract says to send it: to `<hub>.submit`, persistent JSON with
    `type`, a stable `message_id` and the application's own `user_id`, with a confirm."""
    body = {
        "schema_version": 1,
        "order": order_data(order_id).model_dump(mode="json"),
        "reply_to": reply_to,
    }
    exchange = await channel.get_exchange(names.submit, ensure=False)
    await exchange.publish(
        aio_pika.Message(
            json.dumps(body).encode(),
            content_type="application/json",
            delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
            message_id=f"order:{order_id}:1",
            type="order.submit",
            user_id=USER,
        ),
        routing_key=names.orders,
    )


async def follow(
    connection: aio_pika.abc.AbstractConnection, queue: str, seen: list[dict[str, Any]]
) -> None:
    """Consume the status queue once it exists (a passive declare until then), as the contract
    says: no acks, each body a JSON `order.status`."""
    while True:
        channel = await connection.channel()
        try:
            declared = await channel.declare_queue(queue, passive=True)
        except aio_pika.exceptions.ChannelClosed:
            await asyncio.sleep(0.1)
            continue

        async def take(message: aio_pika.abc.AbstractIncomingMessage) -> None:
            assert message.type == "order.status" and message.content_type == "application/json"
            seen.append(json.loads(message.body))

        await declared.consume(take, no_ack=True)
        return


async def test_a_status_queue_declared_otherwise_still_gets_its_statuses(
    topo: Topology, app: aio_pika.abc.AbstractConnection
) -> None:
    await topo.start_all()
    names = Names(topo.hub)
    channel = await app.channel(publisher_confirms=True)
    seen: dict[str, list[dict[str, Any]]] = {tag: [] for tag in DECLARED}
    for tag, declaration in DECLARED.items():
        queue = f"{names.status_prefix(USER)}{tag}"
        if declaration is not None:
            await (await app.channel()).declare_queue(queue, **declaration)
        await publish_order(channel, names, f"o-{tag}", queue)
        await asyncio.wait_for(follow(app, queue, seen[tag]), timeout=30)

    async def all_told() -> bool:
        return all(
            [s["status"] for s in got][-1:] == ["Completed"] and len(got) >= 3
            for got in seen.values()
        )

    await eventually(all_told, timeout=60, what="every application told of its order")
    for tag, got in seen.items():
        assert [s["status"] for s in got] == ["Received", "Processing", "Completed"], tag
        assert {s["order_id"] for s in got} == {f"o-{tag}"}, "the application's own id"
    log = topo.logs("submission")
    assert "could not declare a status queue" not in log
    # What differed is told once per queue, and a queue declared as submission does is not.
    assert log.count("bound as it is") == 3
    assert "x-expires is 600000, not 300000" in log
    report = await topo.audit()
    assert report["ok"], report["violations"]


async def test_a_status_queue_that_dead_letters_is_refused_and_its_order_processed(
    topo: Topology, app: aio_pika.abc.AbstractConnection
) -> None:
    """A queue that would send our statuses on (into `<hub>.submit`: every status looped into
    the orders queue) is never bound; the order itself is processed."""
    await topo.start_all()
    names = Names(topo.hub)
    queue = f"{names.status_prefix(USER)}dead-lettering"
    await (await app.channel()).declare_queue(
        queue,
        durable=True,
        arguments={"x-expires": 300_000, "x-dead-letter-exchange": names.submit},
    )
    await publish_order(await app.channel(publisher_confirms=True), names, "o-looping", queue)
    counts = await topo.wait_settled(1, timeout=60)
    assert counts[ProcessState.PROCESSED] == 1

    async def refused() -> bool:
        return "could not declare a status queue" in topo.logs("submission")

    await eventually(refused, timeout=10, what="the refusal logged")
    assert "x-dead-letter-exchange" in topo.logs("submission")
    unbound = await (await app.channel()).declare_queue(queue, passive=True)
    assert unbound.declaration_result.message_count == 0, "no status reached it"
    report = await topo.audit()
    assert report["ok"], report["violations"]
