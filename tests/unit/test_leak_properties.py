"""No card number leaves a process in clear (issue 33, items 3-5), searched by hypothesis.

A card number (generated: any 12 to 19 digits with their Luhn check digit, plain, spaced or
dashed, inside other text) put in an order's free-text field is refused, naming the field, by
the API's model and by the queue's contract alike; put in what a process says (an error text,
an alert, a log line's message, fields and exception, a message id, journal data) it reaches
no output in clear: not the records it is stored in, the log line, a webhook's body in any
format, a command's output or an API answer. The masks are stable (one card, one mark; an
alert id stays its key) and final (nothing more to mask). What is shown masks a card number
standing apart from letters, so hex ids are shown as they are, and an order's identifiers
refuse what would be masked, so an accepted order is shown as it is.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from services.api.models import NewOrder, ShownJSON
from services.cli.render import echo_json, plain
from services.notifier.formats import Event, Notice, TargetKind, body
from services.operator.views import order_data_view
from shared.domain.journal import Alert, AlertKind, Severity
from shared.domain.messages import OrderStatus, OrderStatusUpdate, decode
from shared.domain.models import STORED, ErrorInfo, OrderData
from shared.domain.redaction import redact_shown
from shared.domain.states import ErrorKind, ProcessState
from shared.domain.text import is_safe
from shared.errors import InvalidMessage
from shared.reporting import PoisonAlerts, Reporter
from shared.store.memory import MemoryStore
from shared.telemetry import JsonFormatter
from tests.support.cards import (
    card_digits,
    in_clear,
    prefixes,
    shown_sides,
    suffixes,
    written,
)
from tests.support.factories import order_data

SEARCH = settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow], deadline=None)


@st.composite
def texts_with_a_card(draw: st.DrawFn, *, typed: bool = False) -> tuple[str, str]:
    """(a card number's digits, a text holding it): anywhere but inside a hex id, as what is
    shown is masked; or, `typed`, as a person may type it in an order (beside a letter too, and safe
    to store)."""
    digits = draw(card_digits)
    if typed:
        prefix, suffix = draw(prefixes), draw(suffixes)
        assume(is_safe(prefix) and is_safe(suffix))
    else:
        prefix, suffix = draw(shown_sides)
    return digits, prefix + draw(written(digits)) + suffix


def _no_card(digits: str, output: str) -> None:
    assert in_clear(digits, output) == 0, output
    # Final: nothing more to mask, read as JSON text or as plain text.
    assert redact_shown(output) == output


# -- item 4: refused in every free-text field, and in an identifier that is one

FREE_TEXT = {
    ("customer_id",): 64,
    ("shipping_address", "name"): 200,
    ("shipping_address", "line1"): 200,
    ("shipping_address", "city"): 200,
    ("shipping_address", "postal_code"): 20,
}


def _with(data: dict[str, Any], where: tuple[str, ...], value: str) -> dict[str, Any]:
    if len(where) == 1:
        return data | {where[0]: value}
    return data | {where[0]: _with(data[where[0]], where[1:], value)}


def _refused_at(model: type[OrderData], data: dict[str, Any]) -> list[tuple[str | int, ...]]:
    with pytest.raises(ValidationError) as refused:
        model.model_validate(data)
    return [tuple(error["loc"]) for error in refused.value.errors()]


def _refused_through_the_queue(data: dict[str, Any]) -> str:
    body = json.dumps({"schema_version": 1, "order": data}).encode()
    with pytest.raises(InvalidMessage) as refused:
        decode("order.submit", body, max_bytes=1 << 20)
    return str(refused.value)


@given(st.sampled_from(sorted(FREE_TEXT)), texts_with_a_card(typed=True))
@SEARCH
def test_a_card_number_in_any_free_text_field_is_refused_naming_the_field(
    where: tuple[str, ...], case: tuple[str, str]
) -> None:
    digits, text = case
    assume(len(text) <= FREE_TEXT[where])
    data = _with(order_data("o-1").model_dump(mode="json"), where, text)
    assert _refused_at(OrderData, data) == [where]
    assert _refused_at(NewOrder, data) == [where]  # the API's POST /orders: a 422 naming it
    why = _refused_through_the_queue(data)  # an `invalid` dead letter, saying where
    assert why.startswith(".".join(("order", *where)) + ": ") and "card number" in why
    _no_card(digits, why)


@given(
    card_digits,
    st.sampled_from(["", "-"]),
    st.sampled_from(["", "o-", "o.", "o_"]),
    st.sampled_from(["order_id", "payment_token"]),
)
@SEARCH
def test_an_identifier_holding_a_card_number_apart_is_refused(
    digits: str, sep: str, prefix: str, field: str
) -> None:
    written_ = sep.join(digits[i : i + 4] for i in range(0, len(digits), 4))
    value = f"{prefix}{written_}" if field == "order_id" else f"tok_{prefix}{written_}"
    data = order_data("o-1").model_dump(mode="json") | {field: value}
    assert _refused_at(OrderData, data) == [(field,)]
    assert _refused_at(NewOrder, data) == [(field,)]


@given(st.text("0123456789abcdef", min_size=20, max_size=64), st.sampled_from(["", "ord-", "tok_"]))
# Found by this search in CI: the order id was `o` + the hex digits, and a run beside a letter
# that is no hex letter is masked (`v4111…`), so the id was refused, as it should be.
@example(hexits="122428400000011278a0", prefix="tok_")
@SEARCH
def test_hex_ids_are_accepted_and_shown_as_they_are(hexits: str, prefix: str) -> None:
    # A hex id holds a Luhn-valid run of 12 digits now and then, but beside a letter (or as a
    # run of more than 19 digits): a trace id, a fingerprint, `ord-<hex>` are never masked.
    assert redact_shown(prefix + hexits) == prefix + hexits
    if prefix:
        order_id = f"o-{hexits}"[:64] if prefix == "tok_" else (prefix + hexits)[:64]
        data = order_data(order_id, payment_token=f"tok_{hexits}"[:64])
        assert redact_shown(data.model_dump(mode="json")) == data.model_dump(mode="json")


def test_an_identifier_holding_a_card_number_beside_a_letter_is_accepted_and_shown() -> None:
    data = order_data("ord-4111111111111111a", payment_token="tok_a4111111111111111")
    assert redact_shown(data.model_dump(mode="json")) == data.model_dump(mode="json")
    # In free text, a person's typing, it is refused all the same.
    with pytest.raises(ValidationError, match="customer_id"):
        order_data("o-1", customer_id="card4111111111111111")


def test_records_read_back_from_a_store_are_read_as_they_are() -> None:
    data = order_data("o-1").model_dump(mode="json") | {"customer_id": "4111111111111111"}
    assert OrderData.model_validate(data, context=STORED).customer_id == "4111111111111111"


# -- item 3: what a process says holds none in clear


@given(texts_with_a_card())
@SEARCH
def test_records_that_quote_a_card_number_hold_it_masked(case: tuple[str, str]) -> None:
    digits, text = case
    now = datetime.now(UTC)
    alert = Alert(
        alert_id=f"poison:h.orders:{text}:invalid",
        kind=AlertKind.POISON_MESSAGE,
        severity=Severity.WARNING,
        message=f"message {text} on h.orders dead-lettered (invalid): {text}",
        at=now,
        order_id=text,
        source=text,
    )
    error = ErrorInfo(kind=ErrorKind.PERMANENT, message=f"declined: {text}", at=now)
    status = OrderStatusUpdate(
        order_id="o-1",
        status=OrderStatus.FAILED,
        process_state=ProcessState.ERROR,
        at=now,
        detail=text,
    )
    for record in (alert, error, status):
        _no_card(digits, json.dumps(record.model_dump(mode="json"), ensure_ascii=False))


def test_an_alert_id_masked_stays_its_key() -> None:
    def alert_id(message_id: str) -> str:
        return Alert(
            alert_id=f"poison:h.orders:{message_id}:invalid",
            kind=AlertKind.POISON_MESSAGE,
            severity=Severity.WARNING,
            message="m",
            at=datetime.now(UTC),
        ).alert_id

    one = alert_id("4111111111111111")
    assert one == alert_id("4111111111111111") == alert_id("4111 1111 1111 1111")
    assert one.startswith("poison:h.orders:[redacted card number #") and "4111" not in one
    assert one != alert_id("5555555555554444")  # two cards, two alerts
    long_id = alert_id("x" * 120 + "4111111111111111")  # cut to the limit: masked first
    assert len(long_id) <= 128 and in_clear("4111111111111111", long_id) == 0


@given(texts_with_a_card())
@SEARCH
def test_a_log_line_quoting_a_card_number_holds_it_masked(case: tuple[str, str]) -> None:
    digits, text = case
    try:
        raise ValueError(text)
    except ValueError:
        exc_info = sys.exc_info()
    record = logging.LogRecord("x", logging.WARNING, __file__, 1, "got %s", (text,), exc_info)
    record.message_id, record.error, record.order_id = text, ValueError(text), text
    event = json.loads(JsonFormatter(process="p", hub="h").format(record))
    # The trace ids are the formatter's own (hex: 12 digits in a row in one of twenty or so).
    assert event.pop("trace_id") and event.pop("span_id", None) is None
    _no_card(digits, json.dumps(event))  # as written
    _no_card(digits, json.dumps(event, ensure_ascii=False))  # as a reader decodes it
    assert event["level"] == "warning"


def test_a_log_line_without_a_card_number_is_written_as_before() -> None:
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "step done", (), None)
    record.order_id, record.attempts = "ord-1234567890123", 12345678901234567890
    event = json.loads(JsonFormatter(process="p", hub="h").format(record))
    assert (event["order_id"], event["attempts"]) == ("ord-1234567890123", 12345678901234567890)


@given(texts_with_a_card(), st.sampled_from(list(Event)))
@SEARCH
def test_no_webhook_body_shows_a_card_number(case: tuple[str, str], event: Event) -> None:
    digits, text = case
    # As stored before alerts were masked: read back as it is, so the formats must mask.
    alert = Alert.model_validate(
        {
            "alert_id": f"poison:h.orders:{text}:invalid",
            "kind": AlertKind.POISON_MESSAGE,
            "severity": Severity.WARNING,
            "message": f"message {text}: {text}",
            "at": datetime.now(UTC),
            "order_id": text,
            "data": {"error": text},
        },
        context=STORED,
    )
    assert in_clear(digits, alert.message) > 0
    at = None if event is Event.TRIGGER else datetime.now(UTC)
    notice = Notice("h", alert, event, by=text if at else None, at=at)
    for kind in TargetKind:
        sent = body(kind, notice, routing_key="R0123456789012345678901234567890")
        _no_card(digits, json.dumps(sent, ensure_ascii=False).replace("R012345678901234", ""))
        if kind is TargetKind.PAGERDUTY:
            assert sent["routing_key"] == "R0123456789012345678901234567890"  # a secret, as set


@given(texts_with_a_card())
@SEARCH
def test_no_command_output_shows_a_card_number(case: tuple[str, str]) -> None:
    digits, text = case
    _no_card(digits, plain(text))
    _no_card(digits, plain(f"{text}\n{text}", keep_lines=True))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        echo_json({"messages": [{"message_id": text, "error": f"({text})", text: int(digits)}]})
    _no_card(digits, out.getvalue())


@given(texts_with_a_card())
@SEARCH
def test_no_api_answer_shows_a_card_number(case: tuple[str, str]) -> None:
    digits, text = case
    answer = ShownJSON({"detail": text, "messages": [{"message_id": text, "n": int(digits)}]})
    _no_card(digits, bytes(answer.body).decode())
    if not digits.startswith("0"):  # as a number, the card is its digits
        number = json.loads(bytes(answer.body))["messages"][0]["n"]
        assert number.startswith("[redacted card number #")


def test_an_api_answer_without_a_card_number_is_rendered_as_before() -> None:
    content = {"order_id": "o-1", "total_cents": 123456789012345, "note": "ø"}
    assert json.loads(bytes(ShownJSON(content).body)) == content


@given(st.one_of(texts_with_a_card().map(lambda case: case[1]), st.text()))
@SEARCH
def test_masking_twice_masks_nothing_more(text: str) -> None:
    once = redact_shown(text)
    assert redact_shown(once) == once
    value = {"a": [once, {once: once}]}
    assert redact_shown(value) is value


# -- alerts as a process raises them, and its log line


class _Published:
    def __init__(self) -> None:
        self.sent: list[Any] = []

    async def publish(self, contract: Any, **fields: Any) -> None:
        self.sent.append(contract)


async def test_a_poison_alert_and_its_log_line_hold_no_card_number(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The issue's case: a schema_version holding a card number, a message id that is one."""
    store, published = MemoryStore(), _Published()
    reporter = Reporter(store, published, _names(), source="h-submission")  # type: ignore[arg-type]
    poison = PoisonAlerts(reporter, "h.orders", window_s=0)
    error = 'order.submit schema_version "4111 1111 1111 1111" is not one of [1]'
    with caplog.at_level(logging.WARNING, logger="shared.reporting"):
        await poison("unsupported-schema-version", error, "m-1")
        await poison("invalid", "order: Field required", "4000056655665556")
        await poison("invalid", "order: Field required", "4000056655665556")  # the same again
    alerts = await store.list_alerts(limit=10)
    assert len(alerts) == 2 and len(published.sent) == 2  # the repeat is the same alert
    formatter = JsonFormatter(process="p", hub="h")
    lines = [formatter.format(r) for r in caplog.records]
    assert any('"alert raised"' in line for line in lines)
    for shown in [*(a.model_dump_json() for a in alerts), *lines]:
        for card in ("4111111111111111", "4000056655665556"):
            assert in_clear(card, shown) == 0, shown


def _names() -> Any:
    from shared.broker.topology import Names

    return Names("h")


# -- item 5: the payment token by its start, in every view


def test_an_orders_view_shows_its_payment_token_by_its_start_only() -> None:
    shown = order_data_view(order_data("o-1", payment_token="tok_4242abcdef987654"))
    assert shown["payment_token"] == "tok_4242…"
    assert shown["customer_id"] == "c-42"
