"""Who may send what (shared/broker/senders.py), the dead-letter seal (shared/broker/seal.py),
the headers a copy carries, and what a reply must match: by example and by search."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared.broker.envelope import CARRIED, HEADER_BUDGET, HEADERS_DROPPED, OURS, carried_headers
from shared.broker.private import Expected
from shared.broker.seal import Sealed, seal_key
from shared.broker.senders import (
    APP,
    SERVICE_ROLES,
    STATUS_SENDERS,
    Senders,
    queue_role,
    queue_senders,
    role_users,
)
from shared.broker.topology import Names
from shared.config import load_settings
from shared.domain.messages import StepAction, StepOutcome, StepReply

N = Names("h")
USERS = role_users("h")


def test_each_input_queue_takes_messages_from_its_senders_only() -> None:
    assert queue_senders(N, N.orders) == {APP}
    assert queue_senders(N, N.agent("payment")) == {"scheduler"}
    assert queue_role(N, N.agent("payment")) == "agent-payment"
    assert queue_role(N, N.orders) == "submission"
    with pytest.raises(ValueError):
        queue_role(N, N.alerts)


@pytest.mark.parametrize("role", SERVICE_ROLES)
def test_a_process_under_its_own_user_tells_every_role_apart(role: str) -> None:
    senders = Senders.of("h", None, USERS[role], role)
    assert senders.strict
    for other, user in USERS.items():
        assert senders.role_of(user) == other
        assert (senders.refusal(user, {role}) is None) == (other == role)
    assert senders.role_of("shop") == APP
    assert senders.refusal("shop", {APP}) is None
    assert senders.refusal(None, {APP, *SERVICE_ROLES}) is not None  # no user_id: nobody


def test_an_application_takes_statuses_from_the_reporting_processes_only() -> None:
    shop = Senders.of("h", None, "shop", APP)
    assert shop.strict
    for role, user in USERS.items():
        assert (shop.refusal(user, STATUS_SENDERS) is None) == (role in STATUS_SENDERS)
    assert shop.refusal("other-shop", STATUS_SENDERS) is not None
    assert shop.refusal("shop", STATUS_SENDERS) is None  # itself: no forgery (nor in development)
    guest = Senders.of("h", None, "guest", APP)  # one user for every process
    assert guest.refusal("guest", STATUS_SENDERS) is None
    assert guest.refusal("intruder", STATUS_SENDERS) is not None


@given(own=st.sampled_from(["guest", "h-scheduler-2", "ops"]), sender=st.text(max_size=20))
def test_one_user_for_all_accepts_only_that_user(own: str, sender: str) -> None:
    """`guest` for every process (development): no role can be told apart, so only messages
    under the same user are taken, which nobody else can send either."""
    senders = Senders.of("h", None, own, "scheduler")
    assert not senders.strict
    assert (senders.refusal(sender, {"agent-payment"}) is None) == (sender == own)


def test_another_prefix_names_the_users() -> None:
    senders = Senders.of("h", "prod-", "prod-agent-payment", "agent-payment")
    assert senders.strict
    assert senders.refusal("prod-scheduler", {"scheduler"}) is None
    assert senders.refusal("h-scheduler", {"scheduler"}) is not None  # an application's name


SEALED = Sealed(
    queue="h.agent.payment",
    sender="h-scheduler",
    message_id="o-1:1:payment",
    message_type="step.request",
    correlation_id="c" * 32,
    reply_to=None,
    body=b'{"order_id": "o-1"}',
)


@given(
    field=st.sampled_from(
        ["queue", "sender", "message_id", "message_type", "correlation_id", "reply_to", "body"]
    ),
    value=st.one_of(st.none(), st.text(max_size=30), st.binary(max_size=30)),
)
def test_a_seal_checks_only_for_exactly_what_was_sealed(field: str, value: Any) -> None:
    key = b"k" * 32
    seal = SEALED.seal(key)
    assert SEALED.checks(key, seal)
    assert not SEALED.checks(b"other key", seal)
    assert not SEALED.checks(None, seal)
    if field == "body":
        value = value if isinstance(value, bytes) else str(value).encode()
    elif isinstance(value, bytes) or (value is None and field in ("queue", "sender")):
        value = str(value)
    changed = replace(SEALED, **{field: value})
    assert changed.checks(key, seal) == (changed == SEALED)


def test_the_key_is_set_or_derived_from_the_broker_password_of_each_kind() -> None:
    a = seal_key(load_settings(rabbitmq_url="amqp://h-payment:secret-1@host/").broker)
    b = seal_key(load_settings(rabbitmq_url="amqp://h-payment:secret-2@host/").broker)
    assert a and b and a != b  # each kind's password, so each kind's key
    assert (
        seal_key(load_settings(rabbitmq_url="amqps://h-payment@host/?auth=external").broker) is None
    )
    kept = load_settings(rabbitmq_url="amqp://u:new@host/", seal_key="stays")
    assert seal_key(kept.broker) == seal_key(
        load_settings(rabbitmq_url="amqp://u:old@host/", seal_key="stays").broker
    )


@given(
    st.dictionaries(
        st.one_of(st.sampled_from([*CARRIED, "x-orderflow-reason", "CC", "other"]), st.text()),
        st.one_of(st.text(max_size=700), st.integers(), st.binary(max_size=20)),
        max_size=20,
    )
)
def test_a_copy_carries_only_allowed_headers_within_their_cap(headers: dict[str, Any]) -> None:
    kept = carried_headers(headers)
    carried = {k: v for k, v in kept.items() if k != HEADERS_DROPPED}
    assert set(carried) <= CARRIED
    assert all(isinstance(v, str) and len(v) <= 512 for v in carried.values())
    assert sum(len(k) + len(v.encode()) for k, v in carried.items()) <= HEADER_BUDGET
    assert not any(k.startswith(OURS) and k != HEADERS_DROPPED for k in kept)


REQUEST = Expected(
    sender_role="agent-payment",
    order_id="shop/o-1",
    step="payment",
    action=StepAction.DO,
    fencing_token="shop/o-1:2",
    idempotency_key="shop/o-1:payment",
)
REPLY = StepReply(
    order_id="shop/o-1",
    step="payment",
    action=StepAction.DO,
    fencing_token="shop/o-1:2",
    idempotency_key="shop/o-1:payment",
    outcome=StepOutcome.OK,
    attempts_used=1,
)


@pytest.mark.parametrize(
    "change",
    [
        {"order_id": "shop/o-2"},
        {"step": "shipping"},
        {"action": StepAction.UNDO},
        {"fencing_token": "shop/o-1:1"},
        {"idempotency_key": "shop/o-1:payment:undo"},
    ],
)
def test_a_reply_about_anything_else_than_its_request_does_not_match(
    change: dict[str, Any],
) -> None:
    assert REQUEST.mismatch(REPLY) is None
    assert REQUEST.mismatch(REPLY.model_copy(update=change)) == "mismatch"


def test_two_kinds_sharing_a_password_or_a_set_key_still_have_their_own_keys() -> None:
    a = seal_key(load_settings(rabbitmq_url="amqp://h-agent-payment:same@host/").broker)
    b = seal_key(load_settings(rabbitmq_url="amqp://h-agent-shipping:same@host/").broker)
    c = seal_key(load_settings(rabbitmq_url="amqp://h-submission:x@host/", seal_key="one").broker)
    d = seal_key(load_settings(rabbitmq_url="amqp://h-scheduler:y@host/", seal_key="one").broker)
    assert len({a, b, c, d}) == 4


def test_the_inbox_dedupes_a_message_id_within_its_sender_only() -> None:
    from shared.broker.consumer import Delivery
    from shared.broker.dedupe import inbox_key
    from shared.domain.messages import SubmitOrder
    from tests.support.factories import order_data

    def delivery(user: str | None) -> Delivery:
        return Delivery(SubmitOrder(order=order_data("o-1")), "m-1", None, None, {}, 1, user)

    assert inbox_key(delivery("shop-a")) != inbox_key(delivery("shop-b"))
    assert inbox_key(delivery("shop-a")) == inbox_key(delivery("shop-a"))
