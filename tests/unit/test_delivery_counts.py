"""What counts as a delivery: the broker's count, plus what our own held copies carried; never a
count a sender wrote. And which AMQP method returns a message: from RabbitMQ 4.3 on only
`basic.reject` counts a delivery, `basic.nack` does not."""

from __future__ import annotations

from datetime import timedelta
from types import SimpleNamespace
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from shared.broker.delivery import ConsumerPolicy, delivery_count
from shared.broker.detours import Detours, Stats
from shared.broker.envelope import DELIVERIES, RETRIES, Envelope, retry_copy
from shared.broker.topology import Names

OWN = "h-agent-payment"


def _message(headers: dict[str, Any], *, user_id: str | None, redelivered: bool = False) -> Any:
    return SimpleNamespace(
        body=b"{}",
        headers=headers,
        message_id="m-1",
        type="step.request",
        correlation_id=None,
        reply_to=None,
        content_type="application/json",
        user_id=user_id,
        redelivered=redelivered,
    )


def test_a_held_copy_of_ours_carries_its_count_and_no_other_does() -> None:
    held = _message(
        {RETRIES: 0, DELIVERIES: 3, "x-delivery-count": 1}, user_id=OWN, redelivered=True
    )
    assert delivery_count(held, Envelope.of(held).deliveries_before(OWN)) == 5
    # The same headers from another sender count for nothing: it cannot lower its own count,
    # nor raise another's; and on its first delivery its `x-delivery-count` is its own too.
    headers = {RETRIES: 0, DELIVERIES: -50, "x-delivery-count": 2}
    forged = _message(headers, user_id="shop")
    assert Envelope.of(forged).deliveries_before(OWN) == 0
    assert delivery_count(forged, 0) == 1
    assert delivery_count(_message(headers, user_id="shop", redelivered=True), 0) == 3
    # Without our retry header it is no copy of ours, whoever sent it.
    assert Envelope.of(_message({DELIVERIES: 3}, user_id=OWN)).deliveries_before(OWN) == 0


@given(
    before=st.integers(min_value=0, max_value=10_000),
    returned=st.one_of(st.none(), st.integers(min_value=-5, max_value=10_000), st.booleans()),
    redelivered=st.booleans(),
)
def test_a_copy_held_through_an_outage_counts_what_the_original_did(
    before: int, returned: int | bool | None, redelivered: bool
) -> None:
    """However often a message is held and returned, the copy it comes back as counts exactly
    the deliveries the original had counted, none for the return itself."""
    headers: dict[str, Any] = {RETRIES: 0, DELIVERIES: before}
    if returned is not None:
        headers["x-delivery-count"] = returned
    original = _message(headers, user_id=OWN, redelivered=redelivered)
    envelope = Envelope.of(original)
    counted = delivery_count(original, envelope.deliveries_before(OWN))
    assert counted >= before + 1
    copy = retry_copy(
        original,
        envelope,
        retries=0,
        delay_s=1,
        error="StoreUnavailable: down",
        own_user=OWN,
        sender="h-scheduler",
        deliveries=counted - 1,
    )
    # The copy as the broker delivers it back from the retry queue: never delivered before.
    back = _message(dict(copy.headers or {}), user_id=copy.user_id)
    assert delivery_count(back, Envelope.of(back).deliveries_before(OWN)) == counted


class Recording:
    def __init__(self) -> None:
        self.calls: list[tuple[str, bool]] = []

    async def reject(self, requeue: bool = False) -> None:
        self.calls.append(("reject", requeue))

    async def nack(self, requeue: bool = True) -> None:
        self.calls.append(("nack", requeue))


def _detours() -> Detours:
    policy = ConsumerPolicy(
        prefetch=1,
        redelivery_limit=3,
        max_message_bytes=1024,
        dedupe_window=timedelta(hours=1),
        claim_ttl=timedelta(seconds=5),
        handler_timeout=1,
    )
    return Detours(
        queue="h.orders",
        names=Names("h"),
        publisher=None,  # type: ignore[arg-type]
        policy=policy,
        stats=Stats(),
        on_poison=None,
    )


async def test_a_failed_delivery_is_rejected_and_a_return_is_nacked() -> None:
    """RabbitMQ 4.3 counts a `basic.reject` towards a quorum queue's delivery limit and not a
    `basic.nack`: a delivery whose handling failed must count, a message merely given back
    (another consumer holds its claim; a copy the broker would not take) must not."""
    detours = _detours()
    message = Recording()
    await detours.requeue(message, counted=True)  # type: ignore[arg-type]
    await detours.requeue(message)  # type: ignore[arg-type]
    assert message.calls == [("reject", True), ("nack", True)]
