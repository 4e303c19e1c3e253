"""Payment details are masked before a refused message is kept anywhere."""

from __future__ import annotations

import json

import pytest

from shared.domain.redaction import CARD_MARK, MARK, luhn_valid, redact_body, redact_text

VISA = "4111111111111111"


@pytest.mark.parametrize(
    "text",
    [VISA, "4111 1111 1111 1111", "4111-1111-1111-1111", f"card {VISA}.", "378282246310005"],
)
def test_card_numbers_in_text_are_masked(text: str) -> None:
    masked = redact_text(text)
    assert CARD_MARK in masked
    assert "1111" not in masked and "8224" not in masked


@pytest.mark.parametrize(
    "text",
    [
        "4111111111111112",
        "order ord-20261201-000123",
        "1234",
        "2026-12-01",
    ],
)
def test_other_numbers_are_left_alone(text: str) -> None:
    # Not Luhn-valid, too short, or not a digit run: not a card number.
    assert redact_text(text) == text


def test_luhn() -> None:
    assert luhn_valid(VISA) and not luhn_valid("4111111111111112")


def test_json_bodies_lose_card_like_fields_and_card_numbers_anywhere() -> None:
    body = json.dumps(
        {
            "order": {
                "order_id": "o-1",
                "payment": {"card_number": "4111 1111 1111 1111", "CVV": "123", "exp-month": 12},
                "shipping_address": {"line1": f"note: {VISA}"},
                "lines": [{"sku": "a", "quantity": 1, "unit_price_cents": 4111111111111111}],
            }
        }
    ).encode()
    masked, changed = redact_body(body)
    assert changed
    text = masked.decode()
    assert "4111" not in text and "123" not in text
    order = json.loads(masked)["order"]
    assert order["payment"] == {"card_number": MARK, "CVV": MARK, "exp-month": MARK}
    assert order["order_id"] == "o-1"
    assert order["lines"][0]["unit_price_cents"] == CARD_MARK


def test_clean_and_non_json_bodies() -> None:
    clean = b'{"order": {"order_id": "o-1", "payment_token": "tok_abc"}}'
    assert redact_body(clean) == (clean, False)
    assert redact_body(b"\xff\xfe not json") == (b"\xff\xfe not json", False)
    masked, changed = redact_body(f"not json {VISA}".encode())
    assert changed and VISA.encode() not in masked


def test_a_body_the_strict_parser_refuses_is_still_redacted() -> None:
    # Duplicate keys and NaN: refused by decode, and so exactly what reaches a DLQ.
    body = b'{"cvv": "123", "cvv": "456", "x": NaN, "note": "' + VISA.encode() + b'"}'
    masked, changed = redact_body(body)
    assert changed and b"456" not in masked and VISA.encode() not in masked


def test_keyed_values_in_text_that_is_not_json_are_masked() -> None:
    truncated = b'{"order": {"card_number": "5555 5555", "cvv": 123, "name": "x"'
    masked, changed = redact_body(truncated)
    assert changed and b"5555" not in masked and b"123" not in masked and b'"name": "x"' in masked


def test_nothing_to_mask_keeps_the_body_byte_for_byte() -> None:
    body = b'{"a": NaN, "b": [1, 2.5, "x"]}'
    assert redact_body(body) == (body, False)


def test_a_card_number_behind_a_duplicate_key_is_masked() -> None:
    """The parsed value keeps the last of two keys only; the body kept in the DLQ has both
    (found in review: the first one's card number was kept in clear)."""
    body = b'{"note": "4111 1111 1111 1111", "note": "x"}'
    masked, changed = redact_body(body)
    assert changed and b"4111" not in masked
