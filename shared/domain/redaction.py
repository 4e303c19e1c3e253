"""Payment details never stored in clear (DESIGN §3, the pattern's warning on sensitive data).

The order contract accepts a payment token only (`tok_…`), so nothing orderflow writes about an
accepted order holds card data. A refused message is another matter: whatever a sender put in it
would be copied verbatim to a dead-letter queue, where operators list and show it. Every
dead-lettered body passes through `redact_body` first: values under card-like keys and any digit
run that is a valid card number (Luhn) are replaced by a marker.
"""

from __future__ import annotations

import json
import re
from typing import Any

MARK = "[redacted]"
CARD_MARK = "[redacted card number]"

SENSITIVE_KEYS = frozenset(
    {
        "card",
        "cardnumber",
        "pan",
        "cvv",
        "cvv2",
        "cvc",
        "cvc2",
        "securitycode",
        "expiry",
        "expirydate",
        "expmonth",
        "expyear",
        "iban",
        "accountnumber",
        "password",
        "secret",
    }
)
"""Keys (lower case, without `_` and `-`) whose value is never kept, whatever it holds."""

_DIGIT_RUN = re.compile(r"(?<![\d])\d(?:[ -]?\d){12,18}(?![\d])")


def luhn_valid(digits: str) -> bool:
    total = 0
    for i, ch in enumerate(reversed(digits)):
        n = int(ch)
        if i % 2 == 1:
            n = n * 2 - 9 if n > 4 else n * 2
        total += n
    return total % 10 == 0


def redact_text(text: str) -> str:
    """`text` with every card number in it (13-19 digits, spaces or dashes allowed) masked."""

    def mask(match: re.Match[str]) -> str:
        digits = re.sub(r"[ -]", "", match.group())
        return CARD_MARK if luhn_valid(digits) else match.group()

    return _DIGIT_RUN.sub(mask, text)


def _sensitive(key: str) -> bool:
    return re.sub(r"[_\-\s]", "", key.lower()) in SENSITIVE_KEYS


def redact_value(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: MARK if _sensitive(str(k)) else redact_value(v) for k, v in value.items()}
    if isinstance(value, list):
        return [redact_value(v) for v in value]
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, int) and not isinstance(value, bool) and value >= 10**12:
        return CARD_MARK if luhn_valid(str(value)) and len(str(value)) <= 19 else value
    return value


def redact_body(body: bytes) -> tuple[bytes, bool]:
    """The body with payment details masked, and whether anything was."""
    try:
        raw = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        text = body.decode("utf-8", errors="surrogateescape")
        masked = redact_text(text)
        if masked == text:
            return body, False
        return masked.encode("utf-8", errors="surrogateescape"), True
    redacted = redact_value(raw)
    if redacted == raw:
        return body, False
    return json.dumps(redacted, separators=(",", ":")).encode(), True
