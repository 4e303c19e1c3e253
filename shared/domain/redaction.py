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

from shared.domain import jsonsafe

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
    """`value` with payment details masked; the very same object when nothing was (so that
    a NaN, which equals nothing, does not pass for a change)."""
    if isinstance(value, dict):
        out = {k: MARK if _sensitive(str(k)) else redact_value(v) for k, v in value.items()}
        same = all(out[k] is v for k, v in value.items())
        return value if same else out
    if isinstance(value, list):
        items = [redact_value(v) for v in value]
        return value if all(a is b for a, b in zip(items, value, strict=True)) else items
    if isinstance(value, str):
        masked = redact_text(value)
        return value if masked == value else masked
    if isinstance(value, int) and not isinstance(value, bool) and value >= 10**12:
        return CARD_MARK if luhn_valid(str(value)) and len(str(value)) <= 19 else value
    return value


class _Duplicate(Exception):
    """A duplicate key: the parsed value would hide all but the last, so mask it as text."""


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result = dict(pairs)
    if len(result) != len(pairs):
        raise _Duplicate
    return result


_LENIENT = json.JSONDecoder(
    # Read what the strict parser refuses (NaN): a refused body is exactly what gets here.
    # Integers too long for Python to read stay text; none is a card number.
    parse_int=lambda text: int(text) if len(text) <= 1000 else text,
    object_pairs_hook=_no_duplicates,
)


def _key_pattern(key: str) -> str:
    """`key` as `_sensitive` reads it: any case, `_`, `-` or a space allowed between letters."""
    return "[_\\- ]?".join(re.escape(ch) for ch in key)


_KEYED_VALUE = re.compile(
    '"((?i:'
    + "|".join(_key_pattern(k) for k in sorted(SENSITIVE_KEYS, key=len, reverse=True))
    + r'))"\s*:\s*("(?:[^"\\]|\\.){0,200}"|[-+\w.]{1,40})'
)
"""`"key": value` for a sensitive key, in text that is not JSON as a whole (a truncated or
malformed body). Only sensitive keys match, and values are bounded, so no body costs more
than one linear scan."""


def _redact_keyed(text: str) -> str:
    return _KEYED_VALUE.sub(lambda match: f'"{match.group(1)}": "{MARK}"', text)


def _read(body: bytes) -> Any:
    """The body's JSON value, or None when it is not JSON (or too deep to walk safely)."""
    try:
        raw = _LENIENT.decode(body.decode("utf-8"))
    except (ValueError, RecursionError, _Duplicate):  # UnicodeDecodeError, JSONDecodeError
        return None
    if not isinstance(raw, dict | list) or not _shallow(raw):
        return None
    return raw


def _shallow(value: Any) -> bool:
    stack = [(value, 0)]
    while stack:
        node, depth = stack.pop()
        if depth > jsonsafe.MAX_DEPTH:
            return False
        if isinstance(node, dict):
            stack.extend((child, depth + 1) for child in node.values())
        elif isinstance(node, list):
            stack.extend((child, depth + 1) for child in node)
    return True


def redact_body(body: bytes) -> tuple[bytes, bool]:
    """The body with payment details masked, and whether anything was. Total: any bytes at
    all give bytes back (a body that is not JSON is masked as text)."""
    raw = _read(body)
    if raw is None:
        text = body.decode("utf-8", errors="surrogateescape")
        masked = _redact_keyed(redact_text(text))
        if masked == text:
            return body, False
        return masked.encode("utf-8", errors="surrogateescape"), True
    redacted = redact_value(raw)
    if redacted is raw:
        return body, False
    return json.dumps(redacted, separators=(",", ":")).encode(), True
