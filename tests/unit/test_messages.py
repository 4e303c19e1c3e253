from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from shared.domain.messages import (
    CONTRACTS,
    MessageType,
    OrderStatus,
    OrderStatusUpdate,
    StepAction,
    StepRequest,
    SubmitOrder,
    decode,
)
from shared.domain.states import ProcessState
from shared.errors import (
    InvalidMessage,
    MalformedMessage,
    MessageTooLarge,
    UnknownMessageType,
    UnsupportedSchemaVersion,
)
from tests.support.bodies import sample_contracts
from tests.support.factories import order_data

NOW = datetime(2026, 12, 1, tzinfo=UTC)


def samples():
    return [
        SubmitOrder(order=order_data("o-1"), reply_to="app.status"),
        StepRequest(
            order_id="o-1",
            step="charge",
            action=StepAction.DO,
            operation="payment.charge",
            fencing_token="o-1:2",
            idempotency_key="o-1:charge",
            complete_by=NOW,
            attempts_allowed=3,
            payload={"amount_cents": 2500},
            reply_to="h.reply.s1.abc",
            fencing_signature="ab" * 32,
        ),
        OrderStatusUpdate(
            order_id="o-1",
            status=OrderStatus.COMPLETED,
            process_state=ProcessState.PROCESSED,
            at=NOW,
        ),
    ]


@pytest.mark.parametrize("message", samples(), ids=lambda m: m.message_type)
def test_every_contract_round_trips_through_json(message) -> None:
    body = message.to_json()
    assert json.loads(body)["schema_version"] == 1
    assert decode(message.message_type.value, body, max_bytes=65536) == message


def test_a_step_request_from_before_signatures_still_decodes_unsigned() -> None:
    """An older scheduler's request (in flight during an upgrade) has no `fencing_signature`:
    it decodes, as version 1, unsigned; its call is refused by the remote, and the step is
    given back for an attempt that signs (tests/contract/test_remote_and_agent.py)."""
    [request] = [m for m in samples() if isinstance(m, StepRequest)]
    body = json.loads(request.to_json())
    del body["fencing_signature"]
    older = decode("step.request", json.dumps(body).encode(), max_bytes=65536)
    assert isinstance(older, StepRequest) and older.fencing_signature is None
    body["fencing_signature"] = "not-hex"
    with pytest.raises(InvalidMessage, match="fencing_signature"):
        decode("step.request", json.dumps(body).encode(), max_bytes=65536)


def test_every_message_type_has_a_contract() -> None:
    assert set(CONTRACTS) == set(MessageType)


@pytest.mark.parametrize(
    ("type_", "body", "error", "reason"),
    [
        ("order.submit", b"{", MalformedMessage, "malformed"),
        ("order.submit", b"[1, 2]", MalformedMessage, "malformed"),
        ("order.submit", b"\xff\xfe", MalformedMessage, "malformed"),
        ("no.such", b"{}", UnknownMessageType, "unknown-type"),
        (None, b"{}", UnknownMessageType, "unknown-type"),
        (
            "order.submit",
            b'{"schema_version": 2}',
            UnsupportedSchemaVersion,
            "unsupported-schema-version",
        ),
        ("order.submit", b'{"order": {}}', UnsupportedSchemaVersion, "unsupported-schema-version"),
        (
            "order.submit",
            b'{"schema_version": 1, "order": {"order_id": "x"}}',
            InvalidMessage,
            "invalid",
        ),
        ("order.submit", b"{" + b" " * 100 + b"}", MessageTooLarge, "too-large"),
    ],
    ids=[
        "truncated",
        "array",
        "not-utf8",
        "unknown",
        "no-type",
        "v2",
        "no-version",
        "invalid",
        "large",
    ],
)
def test_decode_says_why_a_body_is_refused(type_, body, error, reason) -> None:
    with pytest.raises(error) as caught:
        decode(type_, body, max_bytes=64)
    assert caught.value.reason == reason


def test_invalid_message_names_the_fields() -> None:
    order = order_data("x").model_dump(mode="json")
    del order["customer_id"]
    body = json.dumps({"schema_version": 1, "order": order, "extra": 1}).encode()
    with pytest.raises(InvalidMessage) as caught:
        decode("order.submit", body, max_bytes=65536)
    # Both problems are named, whatever order (or number of further errors) pydantic reports.
    assert "order.customer_id" in str(caught.value)
    assert "extra" in str(caught.value)


def test_the_summary_of_many_problems_does_not_depend_on_their_order() -> None:
    body = json.dumps({"schema_version": 1, "order": {"order_id": "x"}, "extra": 1}).encode()
    with pytest.raises(InvalidMessage) as caught:
        decode("order.submit", body, max_bytes=65536)
    text = str(caught.value)
    named = [part.split(":")[0] for part in text.split(" (+", maxsplit=1)[0].split("; ")]
    assert named == sorted(named)


def test_only_a_status_queue_of_the_hub_and_of_the_publishing_application_gets_statuses() -> None:
    from shared.broker.topology import Names

    names = Names("h")
    mine = names.status_queue("shop")
    assert names.accepted_status_queue(mine, "shop") == mine
    assert names.accepted_status_queue(None, "shop") is None
    refused = [
        (mine, None),  # no user_id: nobody vouches whose queue it is
        (mine, "other-app"),  # one application addressing another's queue
        ("h.status.shop", "shop"),  # no tag
        ("h.status.shop.a.b", "shop"),  # a routing key with more words
        ("other.status.shop.abc", "shop"),  # another hub
        ("h.reply.scheduler-1.abc", "shop"),  # a scheduler's reply queue
        ("amq.gen-abc", "shop"),
        ("h.status.Shop!.abc", "Shop!"),
    ]
    for reply_to, user in refused:
        assert names.accepted_status_queue(reply_to, user) is None, reply_to


@pytest.mark.parametrize(
    "change",
    [
        {"data": {"": {}}},  # the fuzzer's finding (tests/fuzz/regressions/finding-1-…)
        {"data": {"$set": 1}},
        {"data": {"a": {"b.c": 1}}},
        {"data": {"n": 2**64}},
        {"schema_version": -(2**63) - 1},
    ],
    ids=["empty-key", "operator-key", "dotted-key", "huge-int", "huge-version"],
)
def test_a_received_alert_is_refused_unless_every_store_holds_it(change) -> None:
    alert = sample_contracts()[4].model_dump(mode="json")["alert"] | change
    body = json.dumps({"schema_version": 1, "alert": alert}).encode()
    with pytest.raises(InvalidMessage) as caught:
        decode("alert", body, max_bytes=65536)
    assert str(caught.value).startswith("alert: ")


def test_a_received_alert_with_storable_data_decodes() -> None:
    message = sample_contracts()[4]
    alert = message.alert.model_copy(update={"data": {"queue": "h.orders", "n": [1, 2.5]}})
    sent = message.model_copy(update={"alert": alert})
    assert decode("alert", sent.to_json(), max_bytes=65536) == sent


@pytest.mark.parametrize(
    ("at", "says"),
    [
        ("-1", "1969-12-31T23:59:59+00:00 is outside"),  # the fuzzer's finding (finding-2-…)
        ("1013-12-01T12:00:00Z", "is outside"),
        ("9999-12-31T23:59:59-23:59", "is outside"),
        ("2026-12-01T12:00:00", "without its offset"),
    ],
)
def test_a_received_alert_has_a_wire_time(at: str, says: str) -> None:
    alert = sample_contracts()[4].model_dump(mode="json")["alert"] | {"at": at}
    body = json.dumps({"schema_version": 1, "alert": alert}).encode()
    with pytest.raises(InvalidMessage) as caught:
        decode("alert", body, max_bytes=65536)
    assert str(caught.value).startswith("alert: ") and says in str(caught.value)
