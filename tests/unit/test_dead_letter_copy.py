"""A dead letter's copy: card numbers masked in its body, its error and the headers it carries,
with none left in clear across the size cut; sealed with its sender."""

from __future__ import annotations

from types import SimpleNamespace

from shared.broker.envelope import (
    ERROR,
    REDACTED,
    SEAL,
    SENDER,
    Envelope,
    dead_letter_copy,
)
from shared.broker.seal import Sealed

CARD = "4111111111111111"


def _copy(body: bytes, headers: dict[str, object], error: str, max_body: int = 4096) -> object:
    message = SimpleNamespace(
        body=body,
        headers=headers,
        message_id="m-1",
        type="order.submit",
        correlation_id=None,
        reply_to=None,
        content_type="application/json",
        user_id="shop",
    )
    envelope = Envelope.of(message)  # type: ignore[arg-type]
    return dead_letter_copy(
        message,  # type: ignore[arg-type]
        envelope,
        reason="malformed",
        error=error,
        queue="h.orders",
        deliveries=1,
        max_body=max_body,
        sender="shop",
        seal_key=b"k" * 32,
    )


def test_card_numbers_are_masked_in_the_error_and_the_carried_headers() -> None:
    copy = _copy(b"{}", {"traceparent": f"00-{CARD}-01"}, f"field card={CARD} invalid")
    assert CARD not in str(copy.headers)  # type: ignore[attr-defined]
    assert CARD not in str(copy.headers[ERROR])  # type: ignore[attr-defined]
    assert copy.headers[REDACTED] is True  # type: ignore[attr-defined]


def test_no_digits_of_a_card_straddling_the_size_cut_are_left() -> None:
    body = b'{"x": "' + b"a" * 90 + CARD.encode() + b'"}'
    copy = _copy(body, {}, "too large", max_body=100)
    kept = copy.body  # type: ignore[attr-defined]
    assert len(kept) <= 100 and CARD[:3] not in kept.decode(errors="replace")


def test_the_seal_covers_the_body_as_dead_lettered_with_its_sender() -> None:
    copy = _copy(f'{{"card": "{CARD}"}}'.encode(), {}, "conflict")
    headers = copy.headers  # type: ignore[attr-defined]
    sealed = Sealed(
        queue="h.orders",
        sender="shop",
        message_id="m-1",
        message_type="order.submit",
        correlation_id=None,
        reply_to=None,
        body=copy.body,  # type: ignore[attr-defined]
    )
    assert headers[SENDER] == "shop" and sealed.checks(b"k" * 32, headers[SEAL])
