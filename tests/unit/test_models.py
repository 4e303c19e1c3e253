from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from shared.domain.journal import Alert, AlertKind, Severity
from shared.domain.messages import StepReply, StepRequest
from shared.domain.models import ERROR_TEXT_LIMIT, ErrorInfo, OrderLine, RetryBudget, StateRecord
from shared.domain.states import ErrorKind
from shared.domain.text import unsafe_characters
from tests.support.bodies import NOW, sample_contracts
from tests.support.factories import order_data, order_pair


def test_fingerprint_depends_on_the_data_only() -> None:
    a = order_data("o-1")
    assert a.fingerprint() == order_data("o-1").fingerprint()
    assert a.fingerprint() != order_data("o-1", currency="USD").fingerprint()
    assert a.total_cents == 2500


@pytest.mark.parametrize(
    "override",
    [
        {"order_id": "has:colon"},
        {"order_id": ""},
        {"order_id": "x" * 65},
        {"currency": "eur"},
        {"payment_token": "4242424242424242"},
        {"lines": []},
        {"lines": [OrderLine(sku="s", quantity=1, unit_price_cents=1)] * 101},
        {"customer_id": "c" * 65},
    ],
    ids=[
        "colon",
        "empty-id",
        "long-id",
        "currency",
        "card-number",
        "no-lines",
        "too-many-lines",
        "long-customer",
    ],
)
def test_order_data_refuses_what_breaks_its_limits(override: dict) -> None:
    with pytest.raises(ValidationError):
        order_data(**override)


def test_order_data_is_strict() -> None:
    with pytest.raises(ValidationError):
        OrderLine(sku="s", quantity="2", unit_price_cents=1)  # type: ignore[arg-type]
    with pytest.raises(ValidationError):
        OrderLine(sku="s", quantity=0, unit_price_cents=1)


def test_retry_budget_spends_and_exhausts() -> None:
    budget = RetryBudget(limit=3)
    assert (budget.remaining, budget.exhausted) == (3, False)
    spent = budget.spend(3)
    assert (spent.remaining, spent.exhausted) == (0, True)
    assert budget.used == 0
    with pytest.raises(ValueError):
        budget.spend(-1)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("locked_by", "o-1:" + "9" * 130),
        ("owner", "s" * 201),
        ("workflow", ""),
        ("workflow", "w" * 65),
        ("reply_to", "q" * 256),
    ],
)
def test_state_records_refuse_what_breaks_their_limits(field: str, value: str) -> None:
    _, state = order_pair("o-1")
    StateRecord.model_validate(state.model_dump())  # the record as written is fine
    with pytest.raises(ValidationError):
        StateRecord.model_validate(state.model_dump() | {field: value})


# -- values no store can hold, or that would drive a person's screen, are refused at validation


HOSTILE = ["a\x00b", "\x1b]0;pwned\x07", "\x1b[2J", "x\x9b31m", "abc\u202e", "\ud800", "a\rb"]


@pytest.mark.parametrize("text", HOSTILE, ids=repr)
@pytest.mark.parametrize("field", ["customer_id", "name", "line1", "city", "postal_code"])
def test_free_text_refuses_control_characters(field: str, text: str) -> None:
    base = order_data("o-1")
    fields = base.model_dump()
    if field == "customer_id":
        fields["customer_id"] = text
    else:
        fields["shipping_address"][field] = text
    with pytest.raises(ValidationError, match=r"control character U\+|unicode"):
        type(base).model_validate(fields)


def test_free_text_in_any_language_is_accepted() -> None:
    order = order_data("o-1", customer_id="Zoë 東京 👍🏽")
    assert order.customer_id == "Zoë 東京 👍🏽"


def test_error_texts_of_any_length_and_content_are_cleaned_and_cut() -> None:
    text = "\x00\x1b" + "é" * 10_000
    info = ErrorInfo(kind=ErrorKind.TRANSIENT, message=text, at=NOW)
    assert len(info.message) == ERROR_TEXT_LIMIT and not unsafe_characters(info.message)
    reply = sample_contracts()[2]
    assert isinstance(reply, StepReply)
    failed = StepReply.model_validate({**reply.model_dump(), "error_message": text})
    assert failed.error_message is not None and len(failed.error_message) == ERROR_TEXT_LIMIT
    alert = Alert(
        alert_id="poison:" + "m" * 400,
        kind=AlertKind.POISON_MESSAGE,
        severity=Severity.WARNING,
        message=text,
        at=NOW,
        data={"error": "\x00x", "k\x1b": ["\ud800"]},
    )
    assert len(alert.alert_id) <= 128 and len(alert.message) <= 2000
    assert (
        alert.alert_id
        != Alert.model_validate(
            {**alert.model_dump(), "alert_id": "poison:" + "m" * 399 + "n"}
        ).alert_id
    )  # the digest keeps long ids apart
    assert alert.data == {"error": "\\x00x", "k\\x1b": ["\\ud800"]}


@pytest.mark.parametrize(
    "change",
    [
        {"complete_by": "2026-12-01T12:00:00"},  # no offset: cannot be compared with the clock
        {"complete_by": "9999-12-31T23:59:59Z"},  # a deadline past it overflows
        {"payload": {"amount": 2**64}},
        {"payload": {"$where": "1"}},
        {"fencing_token": "o-1:1\x00"},
        {"idempotency_key": "o 1:charge"},
    ],
    ids=repr,
)
def test_step_requests_with_unstorable_values_are_refused(change: dict) -> None:
    request = sample_contracts()[1]
    assert isinstance(request, StepRequest)
    body = {**request.model_dump(mode="json"), **change}
    with pytest.raises(ValidationError):
        StepRequest.model_validate_json(json.dumps(body))
