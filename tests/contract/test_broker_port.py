"""Contract: the broker port (shared/broker/port.py), the same cases on every adapter.

What an adapter must do for the code above the port (consumer, subscription, dead-letter tools,
topology): each case goes through `Connection`, `Sender`, `Feed` and `QueueAdmin` alone, on
RabbitMQ and on the memory broker alike (tests/support/broker_port.py).

A count read right after a publish, a cancel or a close is exact on RabbitMQ's classic queues:
a confirm comes once the queue took the message, and a channel's close returns what it held
before the broker answers it. What a queue does later on its own (dead-lettering, expiry, a
quorum queue's returns) is waited for, with a deadline.
"""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shared.broker.declarations import Difference, declare_as_it_is
from shared.broker.port import (
    BrokerUnavailable,
    ExchangeKind,
    Incoming,
    Outgoing,
    QueueMismatch,
    QueueMissing,
)
from shared.broker.private import STATUS_QUEUE, tolerated
from shared.errors import PublishError, PublishRejected, PublishUnroutable
from tests.conftest import RABBITMQ_USER
from tests.support.broker_port import (
    HEADERS,
    Inbox,
    Port,
    as_utc,
    channel_gone,
    depth_becomes,
    exactly,
    port,
    send,
    taken,
)
from tests.support.waiting import eventually

__all__ = ["port"]  # the fixture, parametrized over the adapters

SENT_AT = datetime(2026, 12, 5, 22, 0, 1, tzinfo=UTC)


async def test_a_message_round_trips_its_properties_and_headers(port: Port) -> None:
    exchange, queue = await port.routed_queue("trip")
    sender = await port.connection.sender(timeout=5)
    headers = {"text": "été", "count": 7, "flag": True, "nested": {"list": [1, "two", False]}}
    sent = Outgoing(
        body=b'{"order_id": "o-1"}',
        headers=headers,
        message_id="m-1",
        correlation_id="c-1",
        reply_to=port.name("replies"),
        type="step.reply",
        content_type="application/json",
        user_id=port.connection.info.user,
        app_id="port-contract",
        timestamp=SENT_AT,
        persistent=True,  # `Incoming` does not say: only a broker's restart would tell
    )
    await sender.publish(sent, exchange=exchange, routing_key=queue)
    assert await port.admin.depth(queue) == 1
    feed = await port.connection.feed(prefetch=10)
    inbox = Inbox()
    await feed.consume(queue, inbox.take)
    got = await inbox.next()
    assert (got.body, exactly(got.headers)) == (sent.body, exactly(headers))
    assert (got.message_id, got.correlation_id, got.reply_to, got.type) == (
        "m-1",
        "c-1",
        sent.reply_to,
        "step.reply",
    )
    assert (got.content_type, got.user_id, got.app_id) == (
        "application/json",
        port.connection.info.user,
        "port-contract",
    )
    assert as_utc(got.timestamp) == SENT_AT and got.expiration is None
    assert (got.exchange, got.routing_key, got.redelivered) == (exchange, queue, False)
    assert isinstance(got.delivery_tag, int) and not got.processed
    assert await port.admin.depth(queue) == 0, "a delivery in hand is not ready"
    await got.ack()
    assert got.processed
    await feed.close()
    assert await port.admin.depth(queue) == 0, "an acked message never comes back"


async def test_depth_purge_and_delete_count_the_ready_messages(port: Port) -> None:
    exchange, queue = await port.routed_queue("counts")
    sender = await port.connection.sender(timeout=5)
    for _ in range(3):
        await send(sender, exchange, queue)
    assert await port.admin.depth(queue) == 3
    assert await port.admin.purge(queue) == 3
    assert await port.admin.depth(queue) == 0
    for _ in range(2):
        await send(sender, exchange, queue)
    assert await port.admin.delete(queue) == 2
    assert await port.admin.delete(queue) == 0, "absent: 0"
    with pytest.raises(QueueMissing):
        await port.admin.depth(queue)
    assert await port.admin.delete(exchange, exchange=True) == 0
    assert await port.admin.delete(exchange, exchange=True) == 0, "absent: 0"


async def test_a_message_no_queue_takes_is_unroutable(port: Port) -> None:
    exchange = await port.exchange("unbound")
    sender = await port.connection.sender(timeout=5)
    with pytest.raises(PublishUnroutable):
        await send(sender, exchange, "nobody")


async def test_a_full_reject_publish_queue_refuses_the_message(port: Port) -> None:
    arguments = {"x-max-length": 1, "x-overflow": "reject-publish"}
    exchange, queue = await port.routed_queue("full", arguments=arguments)
    sender = await port.connection.sender(timeout=5)
    await send(sender, exchange, queue)
    with pytest.raises(PublishRejected):
        await send(sender, exchange, queue)
    assert await port.admin.depth(queue) == 1


async def test_a_publish_to_a_missing_exchange_fails_and_the_sender_goes_on(port: Port) -> None:
    exchange, queue = await port.routed_queue("after-missing")
    sender = await port.connection.sender(timeout=5)
    with pytest.raises(PublishError):
        await send(sender, port.name("no-such-exchange"), queue)
    await send(sender, exchange, queue)
    assert await port.admin.depth(queue) == 1


async def test_a_message_naming_another_user_is_refused(port: Port) -> None:
    """The broker checks `user_id` against the connection's user: what makes a receiver's
    check of its sender (shared/broker/senders.py) worth anything."""
    exchange, queue = await port.routed_queue("forged")
    sender = await port.connection.sender(timeout=5)
    with pytest.raises(PublishError):
        await send(sender, exchange, queue, user_id=f"not-{port.connection.info.user}")
    assert await port.admin.depth(queue) == 0


async def test_a_missing_queue_is_refused_and_the_admin_goes_on(port: Port) -> None:
    missing = port.remember(port.name("missing"))
    with pytest.raises(QueueMissing):
        await port.admin.depth(missing)
    feed = await port.connection.feed(prefetch=1)
    with pytest.raises(QueueMissing):
        await feed.consume(missing, Inbox().take)
    queue = await port.queue("after-missing")
    with pytest.raises(QueueMissing):
        await port.admin.bind(queue, port.remember(port.name("missing.x"), exchange=True))
    assert await port.admin.depth(queue) == 0


async def test_the_admin_says_whether_an_exchange_exists_and_goes_on(port: Port) -> None:
    exchange = await port.exchange("exists")
    assert await port.admin.has_exchange(exchange) is True
    assert await port.admin.has_exchange(port.name("absent")) is False
    assert await port.admin.has_exchange(exchange) is True


async def test_a_queue_redeclared_otherwise_is_refused_and_the_admin_goes_on(port: Port) -> None:
    queue = await port.queue("mismatch", arguments={"x-max-length": 5})
    with pytest.raises(QueueMismatch):
        await port.admin.declare_queue(queue, arguments={"x-max-length": 6})
    await port.admin.declare_queue(queue, arguments={"x-max-length": 5})  # the same: fine
    assert await port.admin.depth(queue) == 0
    exchange = await port.exchange("mismatch.x", ExchangeKind.DIRECT)
    with pytest.raises(QueueMismatch):
        await port.admin.declare_exchange(exchange, ExchangeKind.FANOUT)
    await port.admin.declare_exchange(exchange, ExchangeKind.DIRECT)


async def test_a_queue_declared_otherwise_is_declared_as_it_is_where_accepted(
    port: Port,
) -> None:
    """The broker's refusals name each setting that differs and the queue's value of it, one
    at a time, on both adapters alike (shared/broker/declarations.py reads them)."""
    queue = await port.queue(
        "as-it-is", arguments={"x-expires": 600_000, "x-max-length": 5}, auto_delete=True
    )
    found = await declare_as_it_is(
        port.admin, queue, arguments={"x-expires": 300_000}, accept=lambda d: True
    )
    assert {d.setting: (d.wanted, d.current) for d in found} == {
        "auto_delete": (False, True),
        "x-expires": (300_000, 600_000),
        "x-max-length": (None, 5),
    }
    assert await port.admin.depth(queue) == 0, "the admin goes on"
    exact = await port.queue("exact", arguments={"x-expires": 300_000})
    assert (
        await declare_as_it_is(
            port.admin, exact, arguments={"x-expires": 300_000}, accept=lambda d: False
        )
        == ()
    )
    dead_letters, _ = await port.dead_letters("as-it-is")
    looping = await port.queue("looping", arguments={"x-dead-letter-exchange": dead_letters})
    with pytest.raises(QueueMismatch, match="x-dead-letter-exchange is"):
        await declare_as_it_is(
            port.admin,
            looping,
            arguments={},
            accept=lambda d: d.setting != "x-dead-letter-exchange",
        )
    other = await port.connect("exclusive")
    owned = port.remember(port.name("owned"))
    await (await other.admin()).declare_queue(owned, durable=False, exclusive=True)
    with pytest.raises(QueueMismatch):
        await declare_as_it_is(port.admin, owned, arguments={}, accept=lambda d: True)


async def test_a_feed_holds_at_most_its_prefetch_unsettled(port: Port) -> None:
    exchange, queue = await port.routed_queue("prefetch")
    sender = await port.connection.sender(timeout=5)
    sent = [await send(sender, exchange, queue) for _ in range(5)]
    inbox, settled, most = Inbox(), 0, 0

    async def take(message: Incoming) -> None:
        nonlocal most
        await inbox.take(message)
        most = max(most, len(inbox.got) - settled)

    async def settle(message: Incoming) -> None:
        nonlocal settled
        settled += 1  # counted before the broker can hear of it
        await message.ack()

    feed = await port.connection.feed(prefetch=2)
    await feed.consume(queue, take)
    first, second = await inbox.next(), await inbox.next()
    await depth_becomes(port.admin, queue, 3)
    assert len(inbox.got) == 2, "the broker holds back the other three"
    await settle(first)
    third = await inbox.next()
    await depth_becomes(port.admin, queue, 2)
    assert len(inbox.got) == 3, "one settled, one more delivered"
    await settle(second)
    await settle(third)
    for _ in range(2):
        await settle(await inbox.next())
    assert most == 2 and [m.message_id for m in inbox.got] == sent


async def test_a_feed_without_a_prefetch_holds_any_number_unsettled(port: Port) -> None:
    exchange, queue = await port.routed_queue("unlimited")
    sender = await port.connection.sender(timeout=5)
    sent = [await send(sender, exchange, queue) for _ in range(5)]
    feed, inbox = await port.connection.feed(prefetch=0), Inbox()
    await feed.consume(queue, inbox.take)
    got = [await inbox.next() for _ in range(5)]
    assert [m.message_id for m in got] == sent and not any(m.processed for m in got)
    assert await port.admin.depth(queue) == 0
    for message in got:
        await message.ack()


async def test_a_nack_with_requeue_redelivers_the_message(port: Port) -> None:
    exchange, queue = await port.routed_queue("nack")
    sender = await port.connection.sender(timeout=5)
    sent = await send(sender, exchange, queue)
    feed, inbox = await port.connection.feed(prefetch=1), Inbox()
    await feed.consume(queue, inbox.take)
    first = await inbox.next()
    assert first.redelivered is False
    await first.nack(requeue=True)
    again = await inbox.next()
    assert (again.message_id, again.redelivered) == (sent, True)
    await again.ack()


async def test_a_reject_without_requeue_goes_to_the_dead_letter_exchange(port: Port) -> None:
    dlx, dlq = await port.dead_letters("rejects")
    arguments = {"x-dead-letter-exchange": dlx}
    exchange, queue = await port.routed_queue("rejects", arguments=arguments)
    sender = await port.connection.sender(timeout=5)
    sent = await send(sender, exchange, queue)
    feed, inbox = await port.connection.feed(prefetch=1), Inbox()
    await feed.consume(queue, inbox.take)
    await (await inbox.next()).reject(requeue=False)
    dead = await taken(await port.connection.feed(prefetch=1), dlq)
    assert dead.message_id == sent
    assert [d["reason"] for d in dead.headers["x-death"]] == ["rejected"]
    await dead.ack()
    assert await port.admin.depth(queue) == 0 and inbox.waiting() == 0


async def test_an_ack_of_many_settles_the_earlier_deliveries_of_the_channel(port: Port) -> None:
    exchange, queue = await port.routed_queue("multiple")
    sender = await port.connection.sender(timeout=5)
    sent = [await send(sender, exchange, queue) for _ in range(4)]
    feed, inbox = await port.connection.feed(prefetch=10), Inbox()
    await feed.consume(queue, inbox.take)
    got = {m.message_id: m for m in [await inbox.next() for _ in range(4)]}
    await got[sent[2]].ack(multiple=True)
    await feed.close()  # returns the one delivery left unsettled, and it alone
    await depth_becomes(port.admin, queue, 1)
    back = await taken(await port.connection.feed(prefetch=1), queue)
    assert (back.message_id, back.redelivered) == (sent[3], True)
    await back.ack()


async def test_cancel_stops_deliveries_and_consume_resumes_them(port: Port) -> None:
    exchange, queue = await port.routed_queue("cancel")
    sender = await port.connection.sender(timeout=5)
    feed, inbox = await port.connection.feed(prefetch=10), Inbox()
    tag = await feed.consume(queue, inbox.take)
    assert await feed.consuming(tag) is True
    await send(sender, exchange, queue)
    await (await inbox.next()).ack()
    await feed.cancel(tag)
    assert await feed.consuming(tag) is False
    after = await send(sender, exchange, queue)
    assert await port.admin.depth(queue) == 1, "published after the cancel: ready"
    assert inbox.waiting() == 0
    again = await feed.consume(queue, inbox.take)
    assert await feed.consuming(again) is True
    resumed = await inbox.next()
    assert resumed.message_id == after
    await resumed.ack()
    await feed.close()
    assert await feed.consuming(again) is False


async def test_a_consumer_whose_queue_is_deleted_is_consuming_no_more(port: Port) -> None:
    queue = await port.queue("deleted")
    feed = await port.connection.feed(prefetch=1)
    tag = await feed.consume(queue, Inbox().take)
    assert await feed.consuming(tag) is True
    assert await port.admin.delete(queue) == 0

    async def cancelled_by_the_broker() -> bool:
        return await feed.consuming(tag) is False

    await eventually(cancelled_by_the_broker, what="the consumer cancelled with its queue")


async def test_get_takes_one_unsettled_and_close_gives_it_back(port: Port) -> None:
    exchange, queue = await port.routed_queue("get")
    sender = await port.connection.sender(timeout=5)
    feed = await port.connection.feed(prefetch=10)
    assert await feed.get(queue) is None, "empty"
    sent = await send(sender, exchange, queue)
    first = await feed.get(queue)
    assert first is not None and (first.message_id, first.processed) == (sent, False)
    assert await feed.get(queue) is None, "the only one is in hand"
    await first.nack(requeue=True)
    assert first.processed
    again = await taken(feed, queue)
    assert (again.message_id, again.redelivered) == (sent, True)
    assert again.channel.is_closed is False
    await feed.close()
    await depth_becomes(port.admin, queue, 1)
    assert channel_gone(again), "the channel it came on is gone: reading it raises"


async def test_a_consumer_without_acks_has_its_messages_settled_on_delivery(port: Port) -> None:
    exchange, queue = await port.routed_queue("no-ack")
    sender = await port.connection.sender(timeout=5)
    sent = [await send(sender, exchange, queue) for _ in range(3)]
    feed, inbox = await port.connection.feed(prefetch=1), Inbox()
    await feed.consume(queue, inbox.take, ack=False)
    got = [await inbox.next() for _ in range(3)]  # not held back by the prefetch either
    assert [m.message_id for m in got] == sent and all(m.processed for m in got)
    assert await port.admin.depth(queue) == 0
    await feed.close()
    assert await port.admin.depth(queue) == 0, "nothing comes back on close"


async def test_a_quorum_queue_counts_the_returns_of_a_message(port: Port) -> None:
    dlx, dlq = await port.dead_letters("quorum")
    arguments = {"x-queue-type": "quorum", "x-delivery-limit": 2, "x-dead-letter-exchange": dlx}
    exchange, queue = await port.routed_queue("quorum", arguments=arguments)
    sender = await port.connection.sender(timeout=5)
    sent = await send(sender, exchange, queue)
    counts = []
    for how in ("reject", "close", "reject"):  # a feed's close returns it as failed too
        feed = await port.connection.feed(prefetch=1)
        message = await taken(feed, queue)
        counts.append(message.headers.get("x-delivery-count", 0))  # absent: 0
        assert message.redelivered is (len(counts) > 1)
        if how == "reject":
            await message.reject(requeue=True)
        await feed.close()
    assert counts == [0, 1, 2]
    dead = await taken(await port.connection.feed(prefetch=1), dlq)  # returned once too often
    assert dead.message_id == sent
    assert [d["reason"] for d in dead.headers["x-death"]] == ["delivery_limit"]
    await dead.ack()


async def test_an_exclusive_queue_is_its_connections_alone(port: Port) -> None:
    owner, other = await port.connect("owner"), await port.connect("other")
    name = port.remember(port.name("exclusive"))
    alone = {"durable": False, "exclusive": True, "auto_delete": True}
    mine = await owner.admin()
    await mine.declare_queue(name, **alone)
    assert await mine.depth(name) == 0
    admin = await other.admin()
    with pytest.raises(QueueMismatch):
        await admin.declare_queue(name, **alone)
    with pytest.raises(QueueMismatch):
        await (await other.feed(prefetch=1)).consume(name, Inbox().take)
    await owner.close()

    async def gone() -> bool:
        try:
            await admin.depth(name)
        except QueueMissing:
            return True
        except QueueMismatch:
            return False  # its connection's end not yet seen to
        return False

    await eventually(gone, what="the exclusive queue gone with its connection")


async def test_a_feeds_own_queue_is_bound_exclusive_and_goes_with_its_consumer(
    port: Port,
) -> None:
    exchange = await port.exchange("own.x")
    name = port.remember(port.name("own"))
    feed, inbox = await port.connection.feed(prefetch=10), Inbox()
    await feed.own_queue(name, bind_to=exchange, routing_key="mine")
    tag = await feed.consume(name, inbox.take)
    sent = await send(await port.connection.sender(timeout=5), exchange, "mine")
    got = await inbox.next()
    assert got.message_id == sent
    await got.ack()
    other = await port.connect("other")
    with pytest.raises(QueueMismatch):
        await (await other.feed(prefetch=1)).consume(name, Inbox().take)
    await feed.cancel(tag)  # its last consumer

    async def gone() -> bool:
        try:
            await port.admin.depth(name)
        except QueueMissing:
            return True
        return False

    await eventually(gone, what="the queue deleted with its last consumer")


async def test_a_message_past_its_expiration_is_dead_lettered(port: Port) -> None:
    dlx, dlq = await port.dead_letters("ttl")
    exchange, queue = await port.routed_queue("ttl", arguments={"x-dead-letter-exchange": dlx})
    sender = await port.connection.sender(timeout=5)
    sent = await send(sender, exchange, queue, expiration=0.2)
    dead = await taken(await port.connection.feed(prefetch=1), dlq)
    assert dead.message_id == sent
    assert [d["reason"] for d in dead.headers["x-death"]] == ["expired"]
    await dead.ack()
    assert await port.admin.depth(queue) == 0


async def test_after_a_reconnection_what_the_feed_restores_goes_on(port: Port) -> None:
    """Consumers and the feed's own queue come back with the connection, and the callbacks
    are called; a consumer opened with `restore=False` does not (its caller restores it)."""
    exchange, queue = await port.routed_queue("restored")
    manual, own = await port.queue("manual"), port.remember(port.name("own-again"))
    await port.admin.bind(manual, exchange, routing_key=manual)
    reconnected, removed = asyncio.Event(), []
    port.connection.on_reconnect(reconnected.set)
    port.connection.on_reconnect(lambda: removed.append(True))()  # removed at once
    sender = await port.connection.sender(timeout=10)
    feed, kept, mine = await port.connection.feed(prefetch=10), Inbox(), Inbox()
    await feed.own_queue(own, bind_to=exchange, routing_key=own)
    tags = [
        await feed.consume(queue, kept.take),
        await feed.consume(own, mine.take),
        await feed.consume(manual, Inbox().take, restore=False),
    ]
    await port.lose(port.connection)
    await asyncio.wait_for(reconnected.wait(), 15)
    assert port.connection.connected is True and removed == []
    for routing_key, inbox in ((queue, kept), (own, mine)):
        sent = await send(sender, exchange, routing_key)
        got = await inbox.next()
        assert got.message_id == sent
        await got.ack()
    await send(sender, exchange, manual)
    assert await port.admin.depth(manual) == 1, "not restored: nobody consumes it"
    assert [await feed.consuming(tag) for tag in tags] == [True, True, False]


async def test_a_connection_says_what_it_is_and_refuses_to_publish_once_closed(
    port: Port,
) -> None:
    connection = port.connection
    assert connection.connected is True and connection.info.version
    assert connection.info.user == RABBITMQ_USER
    remove = connection.on_reconnect(lambda: None)
    assert callable(remove)
    remove()
    exchange, queue = await port.routed_queue("closing")
    sender = await connection.sender(timeout=5)
    await send(sender, exchange, queue)
    await connection.close()
    await connection.close()  # twice is harmless
    assert connection.connected is False
    with pytest.raises((PublishError, BrokerUnavailable)):
        await send(sender, exchange, queue)


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(headers=HEADERS)
async def test_any_headers_round_trip_exactly(port: Port, headers: dict[str, object]) -> None:
    exchange, queue = await port.routed_queue("headers")  # declared again: the same queue
    sender = await port.connection.sender(timeout=5)
    feed = await port.connection.feed(prefetch=1)
    message_id = uuid.uuid4().hex
    sent = Outgoing(body=b"h", headers=headers, message_id=message_id)
    await sender.publish(sent, exchange=exchange, routing_key=queue)
    got = await taken(feed, queue)
    assert got.message_id == message_id
    assert exactly(got.headers) == exactly(headers)
    await got.ack()
    await feed.close()
    await sender.close()


QUEUE_SETTINGS = st.fixed_dictionaries(
    {"auto_delete": st.booleans()},
    optional={
        "x-expires": st.sampled_from([300_000, 600_000, 3_600_000]),
        "x-message-ttl": st.sampled_from([0, 60_000]),
        "x-max-length": st.sampled_from([0, 5, 1000]),
        "x-overflow": st.sampled_from(["drop-head", "reject-publish", "reject-publish-dlx"]),
        "x-max-priority": st.sampled_from([1, 10]),
        "x-dead-letter-exchange": st.sampled_from(["", "elsewhere"]),
        "x-dead-letter-routing-key": st.just("orders"),
    },
)
"""How an application might have declared its own status queue (classic, each accepted by the
broker): every setting submission compares, harmless or not."""


@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(declared=QUEUE_SETTINGS)
async def test_a_status_queue_is_taken_as_it_is_exactly_when_every_difference_is_harmless(
    port: Port, declared: dict[str, object]
) -> None:
    """Whatever an application declared, submission's declaration of its status queue succeeds
    exactly when each way the queue differs from `STATUS_QUEUE` is `tolerated`, and then says
    each one; never, above all, for a queue that dead-letters (the search around a review's
    finding that a reject-publish queue was taken)."""
    arguments = {k: v for k, v in declared.items() if k.startswith("x-")}
    if "x-dead-letter-routing-key" in arguments and "x-dead-letter-exchange" not in arguments:
        arguments["x-dead-letter-exchange"] = ""  # the broker takes a key only with one
    auto_delete = bool(declared["auto_delete"])
    queue = await port.queue("own-status", arguments=arguments, auto_delete=auto_delete)
    ours = {"durable": True, "auto_delete": False, **STATUS_QUEUE}
    theirs = {"durable": True, "auto_delete": auto_delete, **arguments}
    differing = {
        key: Difference(key, ours.get(key), theirs.get(key))
        for key in ours.keys() | theirs.keys()
        if ours.get(key) != theirs.get(key)
    }
    harmless = all(tolerated(d) for d in differing.values())
    try:
        found = await declare_as_it_is(port.admin, queue, arguments=STATUS_QUEUE, accept=tolerated)
    except QueueMismatch:
        assert not harmless, f"refused, though only {list(differing.values())} differ"
    else:
        assert harmless, f"taken, though {list(differing.values())} differ"
        # What makes a queue harmful, said apart from `tolerated`: it sends our statuses on
        # elsewhere, or refuses them.
        assert not any(key.startswith("x-dead-letter") for key in theirs), theirs
        assert theirs.get("x-overflow") in (None, "drop-head"), theirs
        assert {d.setting: d.current for d in found} == {
            key: d.current for key, d in differing.items()
        }
    finally:
        await port.admin.delete(queue)
