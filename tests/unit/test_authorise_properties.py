"""A search over who may get what accepted by a consumer (`Consumer._authorise`): any
publisher, any claimed sender, with or without our retry header, with a seal that checks, a
forged one or none. Whatever the combination, what is accepted satisfies the invariants of
shared/broker/senders.py and seal.py."""

from __future__ import annotations

from datetime import timedelta
from types import SimpleNamespace
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from shared.broker.consumer import Consumer, ConsumerPolicy
from shared.broker.envelope import RETRIES, SEAL, SENDER, Envelope
from shared.broker.seal import Sealed
from shared.broker.senders import Senders
from shared.broker.topology import Names

N = Names("h")
KEY = b"k" * 32
USERS = ["h-agent-payment", "h-operator", "h-scheduler", "h-agent-inventory", "shop", "guest"]
BODY = b'{"x": 1}'


def consumer(queue: str, own: str) -> Consumer:
    policy = ConsumerPolicy(
        prefetch=1,
        redelivery_limit=3,
        max_message_bytes=4096,
        dedupe_window=timedelta(hours=1),
        claim_ttl=timedelta(seconds=5),
        handler_timeout=5.0,
        own_user=own,
        seal_key=KEY,
    )
    return Consumer(
        connection=None,  # type: ignore[arg-type]
        queue=queue,
        names=N,
        handler=None,  # type: ignore[arg-type]
        store=None,
        dead_letter_publisher=None,  # type: ignore[arg-type]
        policy=policy,
        holder="t",
    )


def message_from(publisher: str | None, headers: dict[str, Any]) -> Any:
    return SimpleNamespace(
        body=BODY,
        headers=headers,
        message_id="m-1",
        type="step.request",
        correlation_id=None,
        reply_to=None,
        content_type="application/json",
        user_id=publisher,
    )


@st.composite
def messages(draw: st.DrawFn, queue: str) -> tuple[Any, str | None, str | None, str]:
    """(message, publisher, claimed sender, seal kind)."""
    publisher = draw(st.sampled_from([None, *USERS]))
    claimed = draw(st.sampled_from([None, *USERS]))
    headers: dict[str, Any] = {}
    if claimed is not None:
        headers[SENDER] = claimed
    if draw(st.booleans()):
        headers[RETRIES] = draw(st.integers(0, 5))
    seal = draw(st.sampled_from(["none", "valid", "forged", "other-queue"]))
    sealed_queue = N.agent("shipping") if seal == "other-queue" else queue
    if seal != "none":
        good = Sealed(
            queue=sealed_queue,
            sender=claimed or "",
            message_id="m-1",
            message_type="step.request",
            correlation_id=None,
            reply_to=None,
            body=BODY,
        ).seal(KEY)
        headers[SEAL] = good if seal in ("valid", "other-queue") else "00" * 32
    return message_from(publisher, headers), publisher, claimed, seal


@settings(max_examples=600)
@given(
    own=st.sampled_from(["h-agent-payment", "guest"]),
    data=st.data(),
)
def test_nothing_is_accepted_that_its_sender_could_not_send(own: str, data: st.DataObject) -> None:
    queue = N.agent("payment")
    message, publisher, claimed, seal = data.draw(messages(queue))
    c = consumer(queue, own)
    sender, refusal = c._authorise(message, Envelope.of(message))
    senders = Senders.of("h", None, own, "agent-payment")
    if refusal is not None:
        return
    assert sender is not None  # nothing without a broker-checked user is accepted
    if senders.strict:
        assert senders.role_of(sender) == "scheduler"  # only schedulers send step requests
    else:
        assert sender == own  # one user for all: only that user
    if sender != publisher:
        # Someone else's message: our own retry copy, or a replay under the operator's user
        # (or our own) whose seal, made for this queue over exactly this message, checks.
        retry = publisher == own and RETRIES in message.headers and SEAL not in message.headers
        replay = seal == "valid" and publisher in ("h-operator", own) and claimed == sender
        assert retry or replay, (publisher, claimed, seal, message.headers)
    assert seal not in ("forged", "other-queue")  # a seal that does not check is never taken


def test_the_search_reaches_acceptance_by_every_path() -> None:
    """The property above is not vacuous: each way in is taken by some message."""
    queue = N.agent("payment")
    c = consumer(queue, "h-agent-payment")

    def accepted(publisher: str, headers: dict[str, Any]) -> str | None:
        message = message_from(publisher, headers)
        sender, refusal = c._authorise(message, Envelope.of(message))  # type: ignore[arg-type]
        return sender if refusal is None else None

    seal = Sealed(queue, "h-scheduler", "m-1", "step.request", None, None, BODY).seal(KEY)
    assert accepted("h-scheduler", {}) == "h-scheduler"
    assert accepted("h-agent-payment", {RETRIES: 1, SENDER: "h-scheduler"}) == "h-scheduler"
    assert accepted("h-operator", {SENDER: "h-scheduler", SEAL: seal}) == "h-scheduler"
    assert accepted("shop", {SENDER: "h-scheduler", SEAL: seal}) is None  # a copied seal
    assert accepted("h-operator", {}) is None  # the operator's own message


def test_a_seal_without_a_user_id_is_not_taken_under_one_user_for_all() -> None:
    """The search's finding: under one user for all, a sealed message with no `user_id` was
    taken as the sealed sender's (the operator-or-own check ran only where roles are apart)."""
    queue = N.agent("payment")
    c = consumer(queue, "guest")
    seal = Sealed(queue, "guest", "m-1", "step.request", None, None, BODY).seal(KEY)
    message = message_from(None, {SENDER: "guest", SEAL: seal})
    _, refusal = c._authorise(message, Envelope.of(message))  # type: ignore[arg-type]
    assert refusal is not None and "only the operator replays" in refusal
