"""Contract: what a hostile sender can put in a message besides its body — properties that are
not UTF-8, headers the client library cannot send again, headers too large to copy, our own
`x-orderflow-…` headers forged — is dead-lettered or handled on its first delivery, and the
consumer goes on with the messages behind it (real RabbitMQ, inbox on the real PostgreSQL).

Before, each of these stopped intake: a message id, type or header name that is not UTF-8, or
a timestamp past the year 9999, made pamqp fail inside the connection's reader, which closed
the consumer's connection; the message came back first in line after the reconnect, and closed
it again (shared/broker/wire.py). A header value that is not UTF-8 reaches the consumer as
`bytes`, which the client library cannot encode into a dead letter (TypeError, requeued
forever); an oversized dead-letter copy made the broker close the connection.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import aiormq
import pytest

from shared.bootstrap import Runtime
from shared.broker.consumer import ERROR, REASON, SOURCE_QUEUE, Delivery
from shared.broker.envelope import HEADERS_DROPPED, RETRIES, SENDER
from shared.broker.port import Outgoing
from shared.config import load_settings
from shared.errors import ConfigurationError
from tests.conftest import POSTGRES_URL, RABBITMQ_URL, RABBITMQ_USER
from tests.support.broker_harness import Broker, reply, send
from tests.support.waiting import eventually
from tests.support.wire_bytes import HUGE_TIMESTAMP, Raw

pytestmark = [pytest.mark.rabbitmq, pytest.mark.postgres]


async def _publish(b: Broker, queue: str, message: Outgoing) -> None:
    await b.publisher.publish_raw(message, exchange=b.names.exchange, routing_key=queue)


async def _publish_raw(b: Broker, queue: str, body: bytes, **properties: Any) -> None:
    """Publish below the port (and aio-pika, which turns a bytes message id into the text of
    its repr)."""
    props = aiormq.spec.Basic.Properties(message_type="step.reply", user_id=RABBITMQ_USER)
    for name, value in properties.items():
        object.__setattr__(props, name, value)  # past pamqp's own type checks
    await b.publish_below(b.names.exchange, queue, body, props)


async def _consume_recording(b: Broker, queue: str) -> list[Delivery]:
    seen: list[Delivery] = []

    async def handler(d: Delivery) -> None:
        seen.append(d)

    await b.consume(queue, handler)
    return seen


async def _good_one_after(b: Broker, queue: str, seen: list[Delivery]) -> None:
    good = await send(b, queue)

    async def handled() -> bool:
        return any(d.message_id == good for d in seen)

    await eventually(handled, what="the message behind handled")


@pytest.mark.parametrize(
    ("properties", "reason"),
    [
        # aio-pika turns a message id of bytes into the text of its repr: usable, so the body
        # decides (before, the connection closed before any of it).
        ({"message_id": Raw(b"\xff\xfe")}, "malformed"),
        ({"message_id": "m-type", "message_type": Raw(b"\xc3\x28")}, "unknown-type"),
        ({"message_id": "m-header", "headers": {Raw(b"\xff"): 1}}, "invalid-properties"),
        ({"message_id": "m-ts", "timestamp": HUGE_TIMESTAMP}, "malformed"),
        ({"message_id": "m-ct", "content_type": Raw(b"\xff")}, "malformed"),
    ],
    ids=["message-id", "type", "header-name", "timestamp", "content-type"],
)
async def test_properties_no_library_can_decode_are_dead_lettered_and_the_connection_stays(
    broker: Broker, properties: dict[str, Any], reason: str
) -> None:
    queue = broker.names.agent("inventory")
    seen = await _consume_recording(broker, queue)
    await _publish_raw(broker, queue, b"{not json", **properties)
    await _good_one_after(broker, queue, seen)
    (dead,) = await eventually(lambda: broker.dead_letters(queue), what="a dead letter")
    assert dead.headers[REASON] == reason
    assert dead.headers["x-orderflow-deliveries"] == 1  # its first delivery, no reconnect
    assert broker.connection.connected


async def test_a_control_character_in_the_message_id_is_refused_too(broker: Broker) -> None:
    queue = broker.names.agent("inventory")
    seen = await _consume_recording(broker, queue)
    await _publish(broker, queue, Outgoing(reply().to_json(), message_id="id\x00\x1b[2J", type="x"))
    await _good_one_after(broker, queue, seen)
    (dead,) = await eventually(lambda: broker.dead_letters(queue), what="a dead letter")
    assert dead.headers[REASON] == "invalid-message-id"


async def test_a_header_the_client_cannot_send_again_is_left_out_of_the_dead_letter(
    broker: Broker,
) -> None:
    queue = broker.names.agent("payment")
    seen = await _consume_recording(broker, queue)
    await _publish_raw(
        broker,
        queue,
        b"{not json",
        message_id="bad-header",
        headers={"binary": Raw(b"\xff\x00"), "traceparent": "00-ab-cd-01", "other": "x"},
    )
    await _good_one_after(broker, queue, seen)
    (dead,) = await eventually(lambda: broker.dead_letters(queue), what="a dead letter")
    assert dead.headers[REASON] == "malformed"
    # Only the allowed headers (trace context) are carried; the rest are named.
    assert dead.headers["traceparent"] == "00-ab-cd-01"
    assert "binary" not in dead.headers and "other" not in dead.headers
    assert dead.headers[HEADERS_DROPPED] == "binary, other"


async def test_headers_too_large_to_copy_are_dropped_and_the_connection_stays_up(
    broker: Broker,
) -> None:
    queue = broker.names.agent("payment")
    seen = await _consume_recording(broker, queue)
    big = {f"h{i}": "x" * 1000 for i in range(100)}  # ~100 KB: fits a frame, not with ours
    big["traceparent"] = "x" * 10_000  # an allowed header, past its cap
    await _publish(
        broker,
        queue,
        Outgoing(b"{not json", message_id="big", type="step.reply", headers=big),
    )
    await _good_one_after(broker, queue, seen)
    (dead,) = await eventually(lambda: broker.dead_letters(queue), what="a dead letter")
    assert dead.headers[REASON] == "malformed"
    assert "traceparent" not in dead.headers and "h1" not in dead.headers
    assert len(str(dead.headers[HEADERS_DROPPED])) <= 501  # the names, cut
    assert broker.connection.connected


async def test_forged_orderflow_headers_are_never_taken_for_ours(broker: Broker) -> None:
    queue = broker.names.orders
    seen = await _consume_recording(broker, queue)
    forged = {
        REASON: "operator-approved",
        SOURCE_QUEUE: broker.names.agent("payment"),
        "x-orderflow-error": "nothing wrong",
    }
    await _publish(
        broker,
        queue,
        Outgoing(b"[]", message_id="forged", type="order.submit", headers=forged),
    )
    await _good_one_after(broker, queue, seen)
    (dead,) = await eventually(lambda: broker.dead_letters(queue), what="a dead letter")
    assert dead.headers[REASON] == "malformed"
    assert dead.headers[SOURCE_QUEUE] == queue


async def test_a_sender_claimed_in_a_header_is_not_believed(broker: Broker) -> None:
    """Without a broker-checked `user_id` a message has no sender, whatever its headers say:
    it is refused, and its dead letter names no sender."""
    queue = broker.names.agent("shipping")
    seen = await _consume_recording(broker, queue)
    await _publish_raw(
        broker,
        queue,
        reply().to_json(),
        message_id="claims-a-sender",
        headers={SENDER: "another-app", RETRIES: 1},
        user_id=None,
    )
    await _good_one_after(broker, queue, seen)
    (dead,) = await eventually(lambda: broker.dead_letters(queue), what="a dead letter")
    assert dead.headers[REASON] == "unauthorised"
    assert "no user_id" in str(dead.headers[ERROR])
    assert SENDER not in dead.headers and all(d.message_id != "claims-a-sender" for d in seen)


async def test_the_sender_is_kept_across_a_delayed_retry(broker: Broker) -> None:
    queue = broker.names.agent("shipping")
    seen: list[Delivery] = []

    async def handler(d: Delivery) -> None:
        seen.append(d)
        if len(seen) == 1:
            raise RuntimeError("once")

    await broker.consume(queue, handler)
    message_id = uuid.uuid4().hex
    await _publish(
        broker,
        queue,
        Outgoing(
            reply().to_json(), message_id=message_id, type="step.reply", user_id=RABBITMQ_USER
        ),
    )

    async def retried() -> bool:
        return len(seen) == 2

    await eventually(retried, what="the delayed retry")
    assert [d.user_id for d in seen] == ["guest", "guest"]
    assert [d.retries for d in seen] == [0, 1]


# -- intake is observable: a consumer says when it has stopped taking messages


async def test_a_consumer_says_it_is_consuming_or_paused(broker: Broker) -> None:
    queue = broker.names.agent("inventory")
    consumer = await broker.consume(queue, _noop)
    status = await consumer.intake(ready=0, stall_after_s=60)
    assert status["state"] == "consuming" and status["queue"] == queue
    await consumer.pause()
    assert (await consumer.intake(ready=0, stall_after_s=60))["state"] == "paused"
    await consumer.resume()
    assert (await consumer.intake(ready=0, stall_after_s=60))["state"] == "consuming"


async def test_a_consumer_the_broker_cancelled_says_it_is_not_subscribed(broker: Broker) -> None:
    queue = broker.names.agent("inventory")
    consumer = await broker.consume(queue, _noop)
    admin = await broker.connection.admin()
    await admin.delete(queue)  # the broker cancels the consumer
    await admin.close()

    async def not_subscribed() -> bool:
        return (await consumer.intake(ready=0, stall_after_s=60))["state"] == "not-subscribed"

    await eventually(not_subscribed, what="the consumer reporting not-subscribed")


async def test_a_consumer_taking_nothing_while_messages_wait_says_it_is_stalled(
    broker: Broker,
) -> None:
    queue = broker.names.agent("payment")
    release = asyncio.Event()

    async def stuck(d: Delivery) -> None:
        await release.wait()

    consumer = await broker.consume(queue, stuck, prefetch=1, handler_timeout=30.0)
    await send(broker, queue)
    await send(broker, queue)  # waits behind the first, which never finishes

    async def stalled() -> dict[str, Any] | None:
        ready = await broker.depth(queue)
        status = await consumer.intake(ready=ready, stall_after_s=0.5)
        return status if status["state"] == "stalled" else None

    status = await eventually(stalled, what="the consumer reporting stalled")
    assert status["ready"] == 1 and status["in_hand"] == 1
    release.set()


async def _noop(d: Delivery) -> None:
    return None


async def test_the_runtime_reads_a_fresh_depth_every_time(broker: Broker) -> None:
    """A robust channel answers a second passive declare from the queue it kept, with the depth
    of the first: a consumer would have been called stalled for good, or never."""
    settings = load_settings(
        hub=broker.names.hub, store_url=POSTGRES_URL, rabbitmq_url=RABBITMQ_URL
    )
    connection = await broker.connect("intake-probe")
    runtime = await Runtime.on(settings, "intake-probe", broker.store, connection)
    try:
        queue = broker.names.agent("shipping")
        assert await runtime._ready(queue) == 0
        await send(broker, queue)
        await send(broker, queue)

        async def two() -> bool:
            return await runtime._ready(queue) == 2

        await eventually(two, what="the probe seeing both messages")
        assert await runtime._ready(f"{broker.names.hub}.no-such-queue") is None
        assert await runtime._ready(queue) == 2  # the probe channel is redone after a 404
    finally:
        await connection.close()  # the store is the fixture's


async def test_routing_headers_a_sender_wrote_never_carry_our_copies_elsewhere(
    broker: Broker,
) -> None:
    """`CC` on a copy published to the direct dead-letter exchange would put it in the DLQ of
    the queue it names too, from which a replay reaches that queue's agent."""
    queue = broker.names.orders
    seen = await _consume_recording(broker, queue)
    elsewhere = broker.names.agent("payment")
    await _publish(
        broker,
        queue,
        Outgoing(
            b"{not json",
            message_id="cc",
            type="step.request",
            headers={"CC": [elsewhere], "BCC": [elsewhere]},
        ),
    )
    await _good_one_after(broker, queue, seen)
    (dead,) = await eventually(lambda: broker.dead_letters(queue), what="a dead letter")
    assert dead.headers[REASON] == "malformed" and "CC" not in dead.headers
    assert await broker.dead_letters(elsewhere) == []


async def test_a_routing_key_that_is_not_utf8_reaches_the_consumer(broker: Broker) -> None:
    """The broker hands the publisher's routing key back in Basic.Deliver: through the fanout
    exchange of applications, any bytes at all (pamqp alone closed the connection over them)."""
    queue = broker.names.orders
    seen = await _consume_recording(broker, queue)
    props = aiormq.spec.Basic.Properties(
        message_id="rk", message_type="step.reply", user_id=RABBITMQ_USER
    )
    await broker.publish_below(broker.names.submit, Raw(b"\xff"), reply().to_json(), props)

    async def handled() -> bool:
        return any(d.message_id == "rk" for d in seen)

    await eventually(handled, what="the message handled")
    await _good_one_after(broker, queue, seen)
    assert broker.connection.connected


async def test_a_consumer_refuses_to_start_without_its_retry_exchange(broker: Broker) -> None:
    """A hub not initialised by this release: setting a message aside would close the shared
    publisher's channel every time, so the process says so at once instead."""
    queue = broker.names.agent("inventory")
    admin = await broker.connection.admin()
    await admin.delete(broker.names.retry(queue), exchange=True)
    await admin.close()
    with pytest.raises(ConfigurationError, match="orderflow init"):
        await broker.consume(queue, _noop)
