"""What only the memory broker's adapter of the port does, beside the port's contract suite it
passes with RabbitMQ's (shared/broker/memory/adapter.py, channels.py): outages and the relink,
severed connections, the simulated wire, exclusive and auto-delete queues, and that mypy sees it
implement the port's protocols without a cast (`test_the_adapter_implements_the_port`, checked
by `mypy tests/unit/test_memory_adapter.py`)."""

from __future__ import annotations

import ast
import asyncio
import uuid
from collections.abc import Callable, Coroutine
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from harness.simulation import loop as virtual
from shared.broker import port
from shared.broker.memory.adapter import MemoryConnection, connect
from shared.broker.memory.server import MemoryBroker
from shared.errors import PublishError, PublishRejected, PublishUnroutable
from tests.support.waiting import eventually

ROOT = Path(__file__).resolve().parents[2]
QUORUM = {"x-queue-type": "quorum"}


def run(main: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """On virtual time: a wait of seconds costs nothing."""
    virtual.run(main())


async def until(condition: Callable[[], bool]) -> None:
    """Wait for `condition`, at most 5 (virtual) seconds."""

    async def probe() -> bool:
        return condition()

    await eventually(probe, timeout=5.0, interval=0.001)


async def hub(
    broker: MemoryBroker, user: str = "u", **arguments: Any
) -> tuple[MemoryConnection, str]:
    """A connection and a durable queue of its own (a unique name)."""
    connection = connect(broker, user)
    queue = f"q-{uuid.uuid4().hex[:8]}"
    admin = await connection.admin()
    await admin.declare_queue(queue, arguments=arguments or None)
    return connection, queue


async def send(connection: MemoryConnection, queue: str, body: bytes, **fields: Any) -> None:
    sender = await connection.sender(timeout=1)
    await sender.publish(port.Outgoing(body, **fields), exchange="", routing_key=queue)
    await sender.close()


async def collect(feed: port.Feed, queue: str, ack: bool = True) -> tuple[list[port.Incoming], str]:
    got: list[port.Incoming] = []

    async def take(delivery: port.Incoming) -> None:
        got.append(delivery)

    return got, await feed.consume(queue, take, ack=ack)


def test_the_adapter_implements_the_port() -> None:
    """Typed assignments mypy checks (no cast, no Any): each object is what the port says."""

    async def main() -> None:
        broker = MemoryBroker()
        memory = connect(broker, "guest", name="typed")
        connection: port.Connection = memory
        sender: port.Sender = await memory.sender(timeout=1)
        feed: port.Feed = await memory.feed(prefetch=5)
        admin: port.QueueAdmin = await memory.admin()
        await admin.declare_queue("typed")
        await sender.publish(port.Outgoing(b"x"), exchange="", routing_key="typed")
        got = await (await memory.feed(prefetch=1)).get("typed")
        assert got is not None
        delivery: port.Incoming = got
        state: port.ChannelState = got.channel
        take: port.Take = _ignore
        await feed.consume("typed", take)
        assert not state.is_closed and delivery.body == b"x"
        assert connection.info == port.BrokerInfo(
            MemoryBroker.VERSION, "amqp://guest@memory/", "guest"
        )
        assert connection.connected
        await connection.close()
        assert not connection.connected and memory.is_closed

    run(main)


async def _ignore(delivery: port.Incoming) -> None:
    """A `port.Take` that leaves the delivery unsettled."""


def test_no_client_library_is_imported() -> None:
    """The adapter speaks the port over the broker model, not an imitation of aio-pika."""
    for module in ("adapter.py", "channels.py"):
        tree = ast.parse((ROOT / "shared/broker/memory" / module).read_text())
        imported = {
            name.split(".")[0]
            for node in ast.walk(tree)
            for name in (
                [alias.name for alias in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
        }
        assert not imported & {"aio_pika", "aiormq", "pamqp"}, module
        assert "cast(" not in (ROOT / "shared/broker/memory" / module).read_text()


def test_an_outage_returns_what_consumers_held_and_delivery_resumes_after_it() -> None:
    async def main() -> None:
        broker = MemoryBroker()
        connection, queue = await hub(broker, **QUORUM)
        reconnected: list[int] = []
        connection.on_reconnect(lambda: reconnected.append(1))
        forget = connection.on_reconnect(lambda: reconnected.append(2))
        forget()
        feed = await connection.feed(prefetch=5)
        got, tag = await collect(feed, queue)
        sender = await connection.sender(timeout=1)
        await send(connection, queue, b"one")
        await until(lambda: len(got) == 1)
        assert not got[0].redelivered
        broker.outage(True)
        assert not connection.connected and not await feed.consuming(tag)
        with pytest.raises(port.BrokerRefused):
            await got[0].ack()  # its channel went with the outage
        with pytest.raises(port.BrokerRefused):
            got[0].channel  # noqa: B018 - the property raises
        with pytest.raises(PublishError):
            await sender.publish(port.Outgoing(b"two"), exchange="", routing_key=queue)
        admin = await connection.admin()  # opened, as on RabbitMQ, but of no use yet
        with pytest.raises(port.BrokerUnavailable):
            await admin.depth(queue)
        await asyncio.sleep(1)
        assert len(got) == 1, "nothing is delivered while the broker is out"
        broker.outage(False)
        assert connection.connected and reconnected == [1] and await feed.consuming(tag)
        await until(lambda: len(got) == 2)
        assert await admin.depth(queue) == 0, "the admin works again; the message is in hand"
        assert got[1].redelivered and got[1].headers["x-delivery-count"] == 1
        assert got[1].body == b"one" and not got[1].processed
        await got[1].ack()
        assert got[1].processed

    run(main)


def test_a_consumer_not_restored_ends_with_an_outage_and_an_own_queue_stays() -> None:
    """`restore=False`: the caller consumes again when told (`on_reconnect`); a queue of the
    connection's own survives an outage (the connection is restored, not a new one)."""

    async def main() -> None:
        broker = MemoryBroker()
        connection, queue = await hub(broker)
        feed = await connection.feed(prefetch=5)
        await feed.own_queue("mine", bind_to=None)
        kept, restored = await collect(feed, "mine", ack=False)
        gone = await feed.consume(queue, refuse, restore=False)
        broker.outage(True)
        broker.outage(False)
        assert await feed.consuming(restored) and not await feed.consuming(gone)
        await send(connection, "mine", b"after")
        await send(connection, queue, b"after")
        await until(lambda: len(kept) == 1)
        assert await (await connection.admin()).depth(queue) == 1, "no consumer took it"

    run(main)


async def refuse(delivery: port.Incoming) -> None:
    raise AssertionError("a consumer that was not restored got a delivery")


def test_a_delivery_taken_back_before_its_consumer_ran_is_not_handed_to_it() -> None:
    """Dispatched, then returned by an outage before the consumer's task ran: the consumer
    sees it once, when the broker delivers it again, not also as a stale delivery."""

    async def main() -> None:
        broker = MemoryBroker()
        connection, queue = await hub(broker)
        got, _ = await collect(await connection.feed(prefetch=5), queue)
        await send(connection, queue, b"one")
        await asyncio.sleep(0)  # the broker dispatches; the consumer's task is yet to run
        assert not broker.queues[queue].ready and not got
        broker.outage(True)
        await asyncio.sleep(0.1)
        assert not got
        broker.outage(False)
        await until(lambda: len(got) == 1)
        await asyncio.sleep(0.1)
        assert len(got) == 1 and got[0].redelivered
        await got[0].ack()

    run(main)


def test_a_connection_made_while_the_broker_is_out_comes_up_with_it() -> None:
    async def main() -> None:
        broker = MemoryBroker()
        broker.outage(True)
        connection = connect(broker, "u")
        assert not connection.connected
        calls: list[str] = []
        connection.on_reconnect(lambda: calls.append("back"))
        broker.outage(False)
        assert connection.connected and calls == ["back"]
        await connection.admin()

    run(main)


def test_a_severed_connection_returns_its_deliveries_and_loses_its_exclusive_queues() -> None:
    async def main() -> None:
        broker = MemoryBroker()
        connection, queue = await hub(broker)
        await (await connection.admin()).declare_queue("mine", exclusive=True)
        got, _ = await collect(await connection.feed(prefetch=5), queue)
        await send(connection, queue, b"one")
        await until(lambda: len(got) == 1)
        connection.sever()
        assert connection.is_closed and "mine" not in broker.queues
        assert [m.redelivered for m in broker.queues[queue].ready] == [True]
        with pytest.raises(port.BrokerRefused):
            await got[0].ack()
        with pytest.raises(port.BrokerUnavailable):
            await connection.feed(prefetch=1)
        with pytest.raises(port.BrokerUnavailable):
            await (await connection.admin()).depth(queue)
        again, _ = await collect(await connect(broker, "u").feed(prefetch=5), queue)
        await until(lambda: len(again) == 1)
        assert again[0].body == b"one" and again[0].redelivered

    run(main)


class _Wire:
    """The simulation's hand on the wire (objects.Network): delays in turn, and duplicates."""

    def __init__(self, delays: list[float], twice: bool = False) -> None:
        self.delays = delays
        self.twice = twice
        self.senders: list[str] = []

    def delay(self, queue: str, sender: str) -> float:
        self.senders.append(sender)
        return self.delays.pop(0)

    def duplicate(self, queue: str, sender: str) -> bool:
        return self.twice


def test_the_network_reorders_late_messages_and_delivers_duplicates() -> None:
    async def main() -> None:
        wire = _Wire([0.5, 0.0])
        broker = MemoryBroker(wire)
        connection, queue = await hub(broker, user="shop")
        got, _ = await collect(await connection.feed(prefetch=5), queue)
        for body in (b"first", b"second"):
            await send(connection, queue, body)
        await until(lambda: len(got) == 2)
        assert [m.body for m in got] == [b"second", b"first"]
        assert wire.senders == ["shop", "shop"]
        broker.network = _Wire([0.0], twice=True)
        await send(connection, queue, b"third")
        await until(lambda: len(got) == 4)
        assert [m.body for m in got[2:]] == [b"third", b"third"]

    run(main)


def test_an_exclusive_queue_is_its_connections_alone_and_a_refusal_leaves_the_admin_usable() -> (
    None
):
    async def main() -> None:
        broker = MemoryBroker()
        owner = connect(broker, "u")
        await (await owner.admin()).declare_queue("mine", exclusive=True, durable=False)
        other = await connect(broker, "u").admin()
        with pytest.raises(port.QueueMismatch):
            await other.declare_queue("mine", exclusive=True, durable=False)
        with pytest.raises(port.QueueMismatch):
            await other.depth("mine")
        with pytest.raises(port.QueueMismatch):
            await other.delete("mine")
        with pytest.raises(port.QueueMismatch):
            await (await connect(broker, "u").feed(prefetch=1)).consume("mine", _ignore)
        with pytest.raises(port.QueueMissing):
            await other.depth("nothing")
        await other.declare_queue("theirs")  # still usable
        assert await other.depth("theirs") == 0
        await owner.close()
        assert "mine" not in broker.queues and "theirs" in broker.queues

    run(main)


def test_an_auto_delete_queue_goes_with_its_last_consumer() -> None:
    async def main() -> None:
        broker = MemoryBroker()
        connection = connect(broker, "u")
        await (await connection.admin()).declare_queue("passing", auto_delete=True)
        feed = await connection.feed(prefetch=1)
        first = await feed.consume("passing", _ignore)
        second = await feed.consume("passing", _ignore)
        await feed.cancel(first)
        assert "passing" in broker.queues and await feed.consuming(second)
        await feed.cancel(second)
        assert "passing" not in broker.queues and not await feed.consuming(second)

    run(main)


def test_a_deleted_queue_cancels_its_consumers() -> None:
    async def main() -> None:
        broker = MemoryBroker()
        connection, queue = await hub(broker)
        feed = await connection.feed(prefetch=1)
        tag = await feed.consume(queue, _ignore)
        assert await feed.consuming(tag)
        assert await (await connection.admin()).delete(queue) == 0
        assert not await feed.consuming(tag)

    run(main)


def test_publishing_confirms_refuses_and_checks_the_user() -> None:
    async def main() -> None:
        broker = MemoryBroker()
        connection, queue = await hub(
            broker, user="shop", **{"x-max-length": 1, "x-overflow": "reject-publish"}
        )
        sender = await connection.sender(timeout=1)
        await sender.publish(port.Outgoing(b"1"), exchange="", routing_key=queue)
        with pytest.raises(PublishRejected):
            await sender.publish(port.Outgoing(b"2"), exchange="", routing_key=queue)
        with pytest.raises(PublishUnroutable):
            await sender.publish(port.Outgoing(b"3"), exchange="", routing_key="nowhere")
        with pytest.raises(PublishError):
            await sender.publish(
                port.Outgoing(b"4", user_id="bank"), exchange="", routing_key=queue
            )
        with pytest.raises(PublishError):
            await sender.publish(port.Outgoing(b"5"), exchange="none", routing_key=queue)
        feed = await connection.feed(prefetch=1)
        got = await feed.get(queue)
        assert got is not None and got.user_id is None, "none is added"
        await got.ack()
        await sender.publish(port.Outgoing(b"6", user_id="shop"), exchange="", routing_key=queue)
        mine = await feed.get(queue)
        assert mine is not None and mine.user_id == "shop", "its own user: taken"

    run(main)


def test_properties_arrive_as_they_were_sent() -> None:
    async def main() -> None:
        broker = MemoryBroker()
        connection, queue = await hub(broker)
        headers = {"n": 7, "s": "text", "t": True, "nested": {"list": [1, "a"]}, "f": 1.5}
        sent = datetime(2026, 12, 5, 12, 0, 0, tzinfo=UTC)
        fields = {
            "message_id": "m-1",
            "correlation_id": "c-1",
            "reply_to": "r",
            "type": "order.placed",
            "content_type": "application/json",
            "app_id": "shop",
            "expiration": 30.0,
            "timestamp": sent,
        }
        await send(connection, queue, b"{}", headers=headers, **fields)
        headers["n"] = 8  # after the publish: not what was sent
        got = await (await connection.feed(prefetch=1)).get(queue)
        assert got is not None
        assert dict(got.headers) == {**headers, "n": 7}
        assert {name: getattr(got, name) for name in fields} == fields
        assert (got.exchange, got.routing_key, got.redelivered) == ("", queue, False)

    run(main)


def test_settling_many_and_twice() -> None:
    async def main() -> None:
        broker = MemoryBroker()
        connection, queue = await hub(broker)
        for body in (b"1", b"2", b"3"):
            await send(connection, queue, body)
        feed = await connection.feed(prefetch=5)
        got, _ = await collect(feed, queue)
        await until(lambda: len(got) == 3)
        await got[1].ack(multiple=True)
        assert [d.processed for d in got] == [True, True, False]
        with pytest.raises(port.BrokerRefused):
            await got[0].ack()
        await got[2].nack(requeue=False)
        assert await (await connection.admin()).depth(queue) == 0

    run(main)


def test_a_nack_of_many_requeues_them_in_the_order_they_came() -> None:
    async def main() -> None:
        broker = MemoryBroker()
        connection, queue = await hub(broker)
        for body in (b"1", b"2", b"3"):
            await send(connection, queue, body)
        feed = await connection.feed(prefetch=5)
        taken = [await feed.get(queue) for _ in range(3)]
        assert all(taken) and taken[2] is not None
        await taken[2].nack(multiple=True, requeue=True)
        again = [await feed.get(queue) for _ in range(3)]
        assert [d.body for d in again if d is not None] == [b"1", b"2", b"3"]
        assert all(d.redelivered for d in again if d is not None)

    run(main)


def test_prefetch_bounds_what_a_consumer_holds_and_closing_returns_it_counted() -> None:
    async def main() -> None:
        broker = MemoryBroker()
        connection, queue = await hub(broker, **QUORUM)
        for body in (b"1", b"2", b"3"):
            await send(connection, queue, body)
        feed = await connection.feed(prefetch=2)
        got, _ = await collect(feed, queue)
        await until(lambda: len(got) == 2)
        await asyncio.sleep(0.1)
        assert len(got) == 2
        await feed.close()
        with pytest.raises(port.BrokerRefused):
            await got[0].ack()
        again = await (await connection.feed(prefetch=1)).get(queue)
        assert again is not None and again.body == b"1"
        assert again.headers["x-delivery-count"] == 1 and again.redelivered

    run(main)


def test_an_unacknowledged_consumer_gets_deliveries_settled_already() -> None:
    async def main() -> None:
        broker = MemoryBroker()
        connection, queue = await hub(broker)
        for body in (b"1", b"2", b"3"):
            await send(connection, queue, body)
        got, _ = await collect(await connection.feed(prefetch=1), queue, ack=False)
        await until(lambda: len(got) == 3)
        assert all(d.processed for d in got)
        await connection.close()
        assert not broker.queues[queue].ready

    run(main)


def test_a_failing_take_is_logged_and_the_feed_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        broker = MemoryBroker()
        connection, queue = await hub(broker)
        seen: list[bytes] = []

        async def take(delivery: port.Incoming) -> None:
            seen.append(delivery.body)
            await delivery.ack()
            raise RuntimeError("a bug")

        await (await connection.feed(prefetch=1)).consume(queue, take)
        for body in (b"1", b"2"):
            await send(connection, queue, body)
        await until(lambda: len(seen) == 2)

    run(main)
    assert "a consumer failed on a delivery" in caplog.text
