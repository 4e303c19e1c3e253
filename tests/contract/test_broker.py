"""Contract: the broker layer against the real RabbitMQ (inbox on the real PostgreSQL)."""

from __future__ import annotations

import asyncio
import json
import time
from datetime import UTC, datetime, timedelta

import pytest

from shared.broker.consumer import (
    REASON,
    REDACTED,
    SOURCE_QUEUE,
    Delivery,
)
from shared.broker.envelope import TRUNCATED
from shared.broker.port import Outgoing
from shared.broker.publisher import Publisher
from shared.broker.topology import QueuePolicy, declare_topology, supports_quorum
from shared.errors import (
    InvalidMessage,
    PermanentError,
    PublishError,
    PublishRejected,
    PublishUnroutable,
    StoreRefused,
    StoreUnavailable,
    TransientError,
)
from shared.store.postgres import PostgresStore
from shared.store.values import InboxClaim
from tests.conftest import RABBITMQ_USER
from tests.support.broker_harness import LIMIT, ORDERS_MAX, Broker, reply, send
from tests.support.waiting import eventually

pytestmark = [pytest.mark.rabbitmq, pytest.mark.postgres]


async def test_topology_declaration_is_idempotent(broker: Broker) -> None:
    admin = await broker.connection.admin()
    quorum = supports_quorum(broker.connection.info.version)
    policy = QueuePolicy(quorum=quorum, delivery_limit=LIMIT, orders_max_length=ORDERS_MAX)
    await declare_topology(admin, broker.names, policy)
    await declare_topology(admin, broker.names, policy)
    assert quorum
    for q in broker.names.input_queues():  # each there (`QueueMissing` otherwise)
        await admin.depth(q)
        await admin.depth(broker.names.dlq(q))
    await admin.close()


async def test_unroutable_message_is_an_error_the_publisher_sees(broker: Broker) -> None:
    with pytest.raises(PublishUnroutable):
        await send(broker, f"{broker.names.hub}.no-such-queue")


async def test_full_orders_queue_makes_the_publisher_see_a_rejection(broker: Broker) -> None:
    accepted = 0
    with pytest.raises(PublishRejected):
        for _ in range(ORDERS_MAX + 2):
            await send(broker, broker.names.orders)
            accepted += 1
    # A quorum queue applies its limit once it is reached, so it may take one message more than
    # `x-max-length` (a classic queue takes exactly that many).
    assert ORDERS_MAX <= accepted <= ORDERS_MAX + 1


async def test_duplicate_message_id_is_handled_once(broker: Broker) -> None:
    queue = broker.names.agent("inventory")
    seen: list[str] = []

    async def handler(d: Delivery) -> None:
        seen.append(d.message_id)

    consumer = await broker.consume(queue, handler)
    first = await send(broker, queue)
    for _ in range(3):
        await send(broker, queue, message_id=first)
    other = await send(broker, queue)

    async def settled() -> bool:
        return consumer.stats.handled + consumer.stats.duplicates == 5

    await eventually(settled, what="five deliveries settled")
    assert sorted(seen) == sorted([first, other])
    assert consumer.stats.duplicates == 3


POISON = {
    "malformed": (b"{not json", "step.reply"),
    "unknown-type": (reply().to_json(), "no.such.type"),
    "unsupported-schema-version": (
        json.dumps({**json.loads(reply().to_json()), "schema_version": 99}).encode(),
        "step.reply",
    ),
    "invalid": (json.dumps({"schema_version": 1, "order_id": "x"}).encode(), "step.reply"),
    "too-large": (b"{" + b" " * 5000 + b"}", "step.reply"),
    # Bodies whose decoding raised something else than a ContractViolation (TypeError,
    # RecursionError, ValueError) and were requeued at the head of the queue again and again:
    "unhashable-version": (b'{"schema_version": [1]}', "step.reply"),
    "deep": (b"[" * 3000 + b"]" * 3000, "step.reply"),
    "huge-integer": (b'{"schema_version": 1, "attempts_used": ' + b"9" * 4400 + b"}", "step.reply"),
}
EXPECTED_REASON = {
    "unhashable-version": "unsupported-schema-version",
    "deep": "malformed",
    "huge-integer": "malformed",
}


@pytest.mark.parametrize("reason", list(POISON))
async def test_poison_message_is_dead_lettered_with_its_reason_and_the_consumer_goes_on(
    broker: Broker, reason: str
) -> None:
    queue = broker.names.agent("payment")
    handled: list[str] = []

    async def handler(d: Delivery) -> None:
        handled.append(d.message_id)

    # The old failures need more than the harness's 4 KiB (Python's limit is 4,300 digits).
    limit = 65536 if reason in EXPECTED_REASON else 4096
    consumer = await broker.consume(queue, handler, max_message_bytes=limit)
    body, type_ = POISON[reason]
    poison = Outgoing(body, message_id="poison-1", type=type_, content_type="application/json")
    await broker.publisher.publish_raw(poison, exchange=broker.names.exchange, routing_key=queue)
    good = await send(broker, queue)

    async def good_handled() -> bool:
        return good in handled

    await eventually(good_handled, what="the next message handled")
    dead = await eventually(lambda: broker.dead_letters(queue), what="a dead letter")
    assert [m.message_id for m in dead] == ["poison-1"]
    assert dead[0].headers[REASON] == EXPECTED_REASON.get(reason, reason)
    assert dead[0].headers["x-orderflow-deliveries"] == 1
    assert dead[0].headers[SOURCE_QUEUE] == queue
    if reason == "too-large":  # kept up to the size limit, and says how large it was
        assert dead[0].headers[TRUNCATED] == len(body)
        assert body.startswith(dead[0].body) and len(dead[0].body) == limit
    else:
        assert dead[0].body == body
    assert consumer.stats.dead_lettered == 1


async def test_a_failing_handler_is_retried_after_delays_then_dead_lettered(
    broker: Broker,
) -> None:
    queue = broker.names.agent("inventory")
    calls: list[tuple[int, int]] = []

    async def handler(d: Delivery) -> None:
        calls.append((d.deliveries, d.retries))
        raise TransientError("remote down")

    consumer = await broker.consume(queue, handler)
    await send(broker, queue, message_id="always-fails")
    dead = await eventually(lambda: broker.dead_letters(queue), what="a dead letter")
    assert dead[0].headers[REASON] == "retries-exhausted"
    assert "remote down" in dead[0].headers["x-orderflow-error"]
    # Each try is a first delivery of a copy that came back from the retry queue.
    assert calls == [(1, n) for n in range(LIMIT + 1)]
    assert consumer.stats.set_aside == LIMIT


async def test_a_handler_that_fails_once_is_handled_on_its_delayed_retry(broker: Broker) -> None:
    queue = broker.names.agent("inventory")
    calls: list[int] = []

    async def handler(d: Delivery) -> None:
        calls.append(d.retries)
        if len(calls) == 1:
            raise TransientError("blip")

    consumer = await broker.consume(queue, handler)
    await send(broker, queue, message_id="fails-once")

    async def handled() -> bool:
        return consumer.stats.handled == 1

    await eventually(handled, what="the delayed retry handled")
    assert calls == [0, 1]
    assert await broker.dead_letters(queue) == []


async def test_a_message_set_aside_does_not_hold_up_the_ones_behind_it(broker: Broker) -> None:
    """The failing message waits out its delay in the retry queue while the next ones are
    handled; before, it was requeued at the head of the queue and came straight back."""
    queue = broker.names.agent("inventory")
    order: list[str] = []

    async def handler(d: Delivery) -> None:
        order.append(d.message_id)
        if d.message_id == "bad" and d.retries == 0:
            raise RuntimeError("an unforeseen bug, once")

    consumer = await broker.consume(queue, handler, prefetch=1, retry_delay=2.0)
    await send(broker, queue, message_id="bad")
    behind = [await send(broker, queue) for _ in range(5)]

    async def all_handled() -> bool:
        return consumer.stats.handled == 6

    await eventually(all_handled, what="every message handled")
    assert order[0] == "bad" and order[1:6] == behind and order[6] == "bad"


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        (PermanentError("the transition table refuses this"), "permanent"),
        (StoreRefused("PostgreSQL refused the data: invalid byte sequence"), "store-refused"),
        (InvalidMessage("not for this queue", reason="wrong-type"), "wrong-type"),
    ],
    ids=["permanent", "store-refused", "contract-violation"],
)
async def test_a_failure_that_will_repeat_is_dead_lettered_at_its_first_delivery(
    broker: Broker, error: Exception, reason: str
) -> None:
    queue = broker.names.agent("payment")
    calls: list[str] = []

    async def handler(d: Delivery) -> None:
        calls.append(d.message_id)
        if d.message_id == "doomed":
            raise error

    consumer = await broker.consume(queue, handler)
    await send(broker, queue, message_id="doomed")
    good = await send(broker, queue)
    dead = await eventually(lambda: broker.dead_letters(queue), what="a dead letter")
    assert dead[0].headers[REASON] == reason
    assert str(error)[:40] in dead[0].headers["x-orderflow-error"]

    async def good_handled() -> bool:
        return good in calls

    await eventually(good_handled, what="the next message handled")
    assert calls.count("doomed") == 1 and consumer.stats.set_aside == 0


async def test_a_message_dead_lettered_by_its_handler_is_handled_again_when_replayed(
    broker: Broker,
) -> None:
    """Its inbox claim is released, not completed: a replay from the DLQ once the cause is
    fixed is handled, not dropped as a duplicate of a delivery that did nothing."""
    queue = broker.names.orders
    calls: list[str] = []

    async def handler(d: Delivery) -> None:
        calls.append(d.message_id)
        if len(calls) == 1:
            raise InvalidMessage("order data conflicts with the recorded order", reason="conflict")

    consumer = await broker.consume(queue, handler)
    await send(broker, queue, message_id="conflicting")
    dead = await eventually(lambda: broker.dead_letters(queue), what="a dead letter")
    assert dead[0].headers[REASON] == "conflict"
    await send(broker, queue, message_id="conflicting")  # the replay

    async def handled() -> bool:
        return consumer.stats.handled == 1

    await eventually(handled, what="the replay handled")
    assert calls == ["conflicting", "conflicting"] and consumer.stats.duplicates == 0


class FailingFor:
    """A publisher that refuses every dead letter for a while, as a broker in trouble does."""

    def __init__(self, publisher: Publisher, seconds: float) -> None:
        self.publisher, self.until, self.refused = publisher, time.monotonic() + seconds, 0

    async def publish_raw(self, message: Outgoing, **where: str) -> None:
        if time.monotonic() < self.until:
            self.refused += 1
            raise PublishRejected("the broker refused the dead letter (test)")
        await self.publisher.publish_raw(message, **where)


async def conflicting(d: Delivery) -> None:
    raise InvalidMessage("order data conflicts with the recorded order", reason="conflict")


async def test_a_dead_letter_the_broker_refuses_for_a_moment_is_held_not_requeued(
    broker: Broker,
) -> None:
    queue = broker.names.orders
    flaky = FailingFor(broker.publisher, seconds=0.5)
    consumer = await broker.consume(queue, conflicting, dead_letters=flaky)
    await send(broker, queue, message_id="unlucky")
    dead = await eventually(lambda: broker.dead_letters(queue), what="a dead letter at last")
    assert flaky.refused >= 1 and [m.message_id for m in dead] == ["unlucky"]
    assert dead[0].headers["x-orderflow-deliveries"] == 1  # held through it: no redelivery
    assert consumer.stats.requeued == 0


async def test_a_poison_message_whose_dead_letter_fails_past_the_patience_is_not_lost(
    broker: Broker,
) -> None:
    """Past the patience the message is requeued, and its redelivery is handled again (not
    dropped as a duplicate of a delivery that never finished)."""
    queue = broker.names.orders
    calls: list[str] = []

    async def handler(d: Delivery) -> None:
        calls.append(d.message_id)
        await conflicting(d)

    flaky = FailingFor(broker.publisher, seconds=1.0)
    consumer = await broker.consume(queue, handler, dead_letters=flaky, outage_patience=0.3)
    await send(broker, queue, message_id="unlucky")
    dead = await eventually(lambda: broker.dead_letters(queue), what="a dead letter at last")
    assert [m.message_id for m in dead] == ["unlucky"]
    assert dead[0].headers[REASON] == "conflict"
    assert len(calls) >= 2, "handled again after the failed dead-letter"
    assert consumer.stats.duplicates == 0 and consumer.stats.requeued >= 1


async def test_stop_drains_the_message_in_hand(broker: Broker) -> None:
    queue = broker.names.agent("payment")
    started = asyncio.Event()
    release = asyncio.Event()
    finished: list[str] = []

    async def handler(d: Delivery) -> None:
        started.set()
        await release.wait()
        finished.append(d.message_id)

    consumer = await broker.consume(queue, handler)
    await send(broker, queue, message_id="slow")
    await asyncio.wait_for(started.wait(), 10)
    stopping = asyncio.create_task(consumer.stop(drain_timeout=10))
    release.set()
    await asyncio.wait_for(stopping, 10)
    assert finished == ["slow"]
    assert consumer.stats.handled == 1


async def test_a_dead_lettered_body_keeps_no_card_number_in_clear(broker: Broker) -> None:
    queue = broker.names.orders

    async def refuse(delivery: Delivery) -> None:
        raise AssertionError("a schema-invalid message never reaches the handler")

    await broker.consume(queue, refuse)
    body = json.dumps(
        {
            "schema_version": 1,
            "order": {"order_id": "o-card", "payment": {"card_number": "4111111111111111"}},
            "note": "card 4111 1111 1111 1111",
        }
    ).encode()
    await broker.publisher.publish_raw(
        Outgoing(body, message_id="card-1", type="order.submit"),
        exchange=broker.names.exchange,
        routing_key=queue,
    )
    dead = await eventually(lambda: broker.dead_letters(queue), what="a dead letter")
    assert dead[0].headers[REDACTED] is True
    assert b"4111" not in dead[0].body
    assert json.loads(dead[0].body)["order"]["order_id"] == "o-card"


async def test_an_outage_after_the_handler_succeeded_does_not_run_it_again(
    broker: Broker,
) -> None:
    """Marking the message done failed once (the store restarting): only that write is
    retried; before, the whole delivery was, and the handler ran twice (found in review)."""
    queue = broker.names.agent("inventory")
    calls: list[str] = []

    class CompletesOnSecondTry:
        def __init__(self, store: PostgresStore) -> None:
            self.store, self.failed = store, False

        def __getattr__(self, name: str):  # everything else as the real store does it
            return getattr(self.store, name)

        async def inbox_complete_many(self, queue: str, done) -> None:
            if not self.failed:
                self.failed = True
                raise StoreUnavailable("PostgreSQL unavailable: restarting (test)")
            await self.store.inbox_complete_many(queue, done)

    async def handler(d: Delivery) -> None:
        calls.append(d.message_id)

    flaky = CompletesOnSecondTry(broker.store)
    consumer = await broker.consume(queue, handler, store=flaky)
    await send(broker, queue, message_id="once")

    async def handled() -> bool:
        return consumer.stats.handled == 1

    await eventually(handled, what="the message handled")
    assert flaky.failed and calls == ["once"]
    await send(broker, queue, message_id="once")  # and it was marked done after all

    async def dropped() -> bool:
        return consumer.stats.duplicates == 1

    await eventually(dropped, what="the copy dropped as a duplicate")


# -- what the broker itself does, which the consumer relies on (both brokers alike)


async def test_the_broker_counts_returns_and_dead_letters_past_its_delivery_limit(
    broker: Broker,
) -> None:
    """A quorum queue counts every return in `x-delivery-count` (what `delivery_count` reads),
    and past `x-delivery-limit` (one above ours) dead-letters the message itself."""
    queue = broker.names.agent("inventory")
    await send(broker, queue, message_id="returned")
    feed = await broker.connection.feed(prefetch=0)
    counts = []
    for _ in range(LIMIT + 2):
        message = await eventually(lambda: feed.get(queue), what="the message back in its queue")
        counts.append((message.headers or {}).get("x-delivery-count", 0))
        assert message.redelivered is (len(counts) > 1)
        await message.reject(requeue=True)
    assert counts == list(range(LIMIT + 2))
    (dead,) = await eventually(lambda: broker.dead_letters(queue), what="the broker's dead letter")
    assert dead.message_id == "returned"
    assert [d["reason"] for d in dead.headers["x-death"]] == ["delivery_limit"]
    await feed.close()


async def test_a_message_naming_another_user_is_refused_by_the_broker(broker: Broker) -> None:
    """The broker checks `user_id` against the publishing connection's user: what makes a
    receiver's check of the sender (shared/broker/senders.py) worth anything."""
    publisher = await Publisher.open(broker.connection, timeout=5)
    forged = Outgoing(reply().to_json(), message_id="forged", user_id="someone-else")
    with pytest.raises(PublishError):
        await publisher.publish_raw(
            forged, exchange=broker.names.exchange, routing_key=broker.names.agent("payment")
        )
    assert await broker.take_all(broker.names.agent("payment")) == []
    await publisher.close()


async def test_a_message_whose_id_another_delivery_holds_waits_out_of_hand_uncounted(
    broker: Broker,
) -> None:
    """Its consumer died handling it, leaving its claim: the copy delivered again does not wait
    for the claim to expire in hand (every crash or broker restart meanwhile would count a
    delivery against it: what the simulation found), but goes back to its queue uncounted."""
    queue = broker.names.agent("inventory")
    seen: list[Delivery] = []

    async def handler(d: Delivery) -> None:
        seen.append(d)

    claim_until = datetime.now(UTC) + timedelta(seconds=1.5)
    key = f"{RABBITMQ_USER}/claimed-elsewhere"
    await broker.store.inbox_claim_many(
        queue, [InboxClaim(key, "a-consumer-that-died", claim_until)], now=datetime.now(UTC)
    )
    consumer = await broker.consume(queue, handler, busy_wait=0.2, busy_poll=0.05)
    await send(broker, queue, message_id="claimed-elsewhere")

    async def handled() -> bool:
        return bool(seen)

    await eventually(handled, what="the message handled once the claim expired")
    assert consumer.stats.held_returns >= 1, "it waited out of hand at least once"
    assert [d.deliveries for d in seen] == [1], "the waits counted no delivery"


async def test_acks_sent_together_never_settle_a_delivery_still_in_hand(broker: Broker) -> None:
    """Handlings that end side by side are acked with one `multiple` ack (shared/broker/acks.py),
    which acks every delivery of the channel up to its tag: whichever of the four around the
    one still being handled end together may go in one, but none passes over it, and it stays
    unacked. When the channel closes it alone comes back. (Which acks went together depends on
    the turns the handlings end in; tests/unit/test_acks.py checks the frames.)"""
    queue = broker.names.agent("shipping")
    release = asyncio.Event()

    async def handler(d: Delivery) -> None:
        if d.message_id == "held":
            await asyncio.Event().wait()  # never ends: in hand until the channel closes
        await release.wait()

    consumer = await broker.consume(queue, handler, handler_timeout=60.0)
    for message_id in ("below-1", "below-2", "held", "above-1", "above-2"):
        await send(broker, queue, message_id=message_id)

    async def all_in_hand() -> bool:
        return consumer.in_hand == 5

    await eventually(all_in_hand, what="five deliveries in hand")
    release.set()

    async def four_handled() -> bool:
        return consumer.stats.handled == 4

    await eventually(four_handled, what="the four around the one held handled and acked")
    await consumer._feed.close()
    got = [message.message_id for message in await broker.take_all(queue)]
    assert got == ["held"]
