"""Payment details never stored in clear (DESIGN §3, the pattern's warning on sensitive data).

The order contract accepts a payment token only (`tok_…`), so nothing orderflow writes about an
accepted order holds card data. A refused message is another matter: whatever a sender put in it
would be copied verbatim to a dead-letter queue, where operators list and show it. Every
dead-lettered body passes through `redact_body` first, and its headers through `redact_headers`:

- a **card number** is 12 to 19 digits that pass the Luhn check, written plain or in groups
  split by single spaces or dashes, with no digit right before or after it. It is masked
  wherever it is: in text, in a key or a header name (the value under it goes too: it is that
  card's data), and in a number (an integer, or the integer part of a float or a Decimal);
- a **sensitive name** is a key or header name that says card data or a secret (`cvv_code`,
  `cardNumber`, `X-Card-PAN`, `exp_month`, …). Its value is masked whatever it holds.

Both read text alike: a `"name": value` pair in text (a body that is not JSON, or JSON inside
a string) is found by one linear scan. The rules, and the redaction of text, are in
shared/domain/redaction_text.py; this module walks bodies, header tables and other values with
them. Redacting is total (any input gives an output, never an
exception), linear in the input's size, and idempotent: what it gives back has nothing more
to mask.

Everything else that leaves a process (log lines, alerts, webhooks, API answers, command
output) passes through `redact_shown`: card numbers only, each masked by its stable mark, so
an id that held one still names one thing (an alert's id stays its idempotency key). And a
payment token, which is no card number but still a means of payment, is shown by its start
only (`short_token`), in every view.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, overload

from shared.domain import jsonsafe
from shared.domain.redaction_text import (
    CARD_MARK,
    MARK,
    card_number,
    has_digit_run,
    is_card,
    luhn_valid,
    may_hold_card,
    redact_pairs,
    redact_text,
    sensitive_name,
    shown_text,
    stable_mark,
)

__all__ = [
    "CARD_MARK",
    "MARK",
    "luhn_valid",
    "may_hold_card",
    "redact_body",
    "redact_headers",
    "redact_shown",
    "redact_text",
    "redact_value",
    "short_token",
    "shorten_tokens",
]


class _CardNumber:
    """What the lenient reader gives for a float written as a card number (once read, its
    digits may be gone: 19 of them do not fit a float)."""


_CARD = _CardNumber()
_MAX_DEPTH = 64
"""Nesting walked; deeper is masked whole (a body never nests beyond `jsonsafe.MAX_DEPTH`)."""


class _Redactor:
    """One walk over a value. `cards` and `pairs` say whether strings may hold card numbers or
    `"name": value` pairs at all (a body's text tells, and most bodies hold neither); `shown`
    masks card numbers only, by their stable marks, in text read both ways (`redact_shown`).
    Tables and lists met twice (a caller's own structures may share or loop) are walked once."""

    def __init__(self, *, cards: bool = True, pairs: bool = True, shown: bool = False) -> None:
        self.cards, self.pairs, self.shown = cards, pairs and not shown, shown
        self.done: dict[int, Any] = {}

    def value(self, value: Any, depth: int) -> Any:
        if value is _CARD:
            return CARD_MARK
        if isinstance(value, dict | list):
            if depth >= _MAX_DEPTH:
                return MARK
            if id(value) not in self.done:
                self.done[id(value)] = (
                    self.table(value, depth + 1)
                    if isinstance(value, dict)
                    else self.array(value, depth + 1)
                )
            return self.done[id(value)]
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, bytes | bytearray):
            text = bytes(value).decode("utf-8", "surrogateescape")
            masked = self.text(text)
            return value if masked is text else _like(value, masked)
        return self.card(value) if self.cards and card_number(value) else value

    def card(self, number: Any) -> str:
        """The mark of a number that is a card number."""
        return stable_mark(str(abs(int(number)))) if self.shown else CARD_MARK

    def text(self, text: str) -> str:
        if self.shown:
            shown = shown_text(text)
            return text if shown == text else shown
        masked = redact_text(text, escapes=False) if self.cards else text
        masked = redact_pairs(masked) if self.pairs and '"' in masked else masked
        return text if masked == text else masked

    def array(self, items: list[Any], depth: int) -> list[Any]:
        out = [self.value(item, depth) for item in items]
        return items if all(a is b for a, b in zip(out, items, strict=True)) else out

    def table(self, table: Mapping[Any, Any], depth: int) -> Any:
        entries: list[tuple[Any, Any, bool]] = []  # (name, value, renamed)
        changed = False
        for key, value in table.items():
            name = self.name(key)
            # A card number's name says the value is its data (a sensitive name too, but for
            # what is shown: card numbers only, found alike in every value).
            sensitive = not self.shown and isinstance(key, str) and sensitive_name(key)
            masked = name is not key or sensitive
            out = _masked(value) if masked else self.value(value, depth)
            entries.append((name, out, name is not key))
            changed = changed or name is not key or out is not value
        if not changed:
            return table
        kept = {name for name, _, renamed in entries if not renamed}
        result: dict[Any, Any] = {}
        counts: dict[Any, int] = {}
        for name, value, renamed in entries:
            free = name
            if renamed:  # numbered apart from every other key: none is lost
                n = counts.get(name, 1)
                while free in kept or free in result:
                    n += 1
                    free = f"{name} ({n})"
                counts[name] = n
            result[free] = value
        return result

    def name(self, key: Any) -> Any:
        if isinstance(key, str):
            if self.shown:
                return self.text(key)
            masked = redact_text(key, escapes=False) if self.cards else key
            return key if masked == key else masked
        return self.card(key) if self.cards and card_number(key) else key


def _like(value: bytes | bytearray, text: str) -> bytes | bytearray:
    raw = text.encode("utf-8", "surrogateescape")
    return bytearray(raw) if isinstance(value, bytearray) else raw


def _masked(value: Any) -> Any:
    """The marker in place of a value: bytes stay bytes, anything else becomes text."""
    if isinstance(value, bytes | bytearray):
        return value if value == MARK.encode() else _like(value, MARK)
    return value if isinstance(value, str) and value == MARK else MARK


def redact_value(value: Any) -> Any:
    """`value` with payment details masked; the very same object when nothing was (so that
    a NaN, which equals nothing, does not pass for a change)."""
    return _Redactor().value(value, 0)


@overload
def redact_shown(value: str) -> str: ...
@overload
def redact_shown(value: Any) -> Any: ...
def redact_shown(value: Any) -> Any:
    """`value` (text, or JSON-like data: tables, lists, numbers) as it may leave a process:
    every card number in it, in a text, a key or a number, masked by its stable mark. The very
    same object when nothing was masked; total, linear, and a text with no run of 12 digits
    (most) costs one scan in C."""
    if isinstance(value, str):
        return shown_text(value)
    return _Redactor(shown=True).value(value, 0)


TOKEN_SHOWN = 8
"""Characters of a payment token shown: enough to tell two apart, never the whole."""


def short_token(token: str) -> str:
    """A payment token as every view shows it (the API's, the console's, the commands'): its
    start only."""
    return token[:TOKEN_SHOWN] + "…" if len(token) > TOKEN_SHOWN else token


def shorten_tokens(value: Any) -> Any:
    """A copy of parsed JSON with every `payment_token` string shortened, at any depth."""
    if isinstance(value, dict):
        return {
            k: short_token(v) if k == "payment_token" and isinstance(v, str) else shorten_tokens(v)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [shorten_tokens(v) for v in value]
    return value


def redact_headers(headers: Mapping[str, Any]) -> tuple[dict[str, Any], bool]:
    """A copy of an AMQP header table with payment details masked, and whether any were.

    Names and values alike, in nested tables and lists. Every value stays one pamqp can encode
    if it could before: str stays str, bytes stay bytes and bytearray stays bytearray (read as
    UTF-8, and bytes that are not UTF-8 are kept as they are but for what is masked), and a
    value under a sensitive or card-number name becomes the marker in the same kind (bytes or
    text). A number cannot hold a marker: a card number sent as an int, float or Decimal
    becomes the text `CARD_MARK`. Anything else (bool, None, datetime, other numbers, and
    types pamqp cannot send) is kept as it is. Total: a table that shares or loops into
    itself is walked once, and nesting past 64 levels is masked whole."""
    masked = _Redactor().table(headers, 0)
    return dict(masked), masked is not headers


# -- bodies


class _Duplicate(Exception):
    """A duplicate key: the parsed value would hide all but the last, so mask it as text."""


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result = dict(pairs)
    if len(result) != len(pairs):
        raise _Duplicate
    return result


def _float(text: str) -> Any:
    # The text's own integer part too: a 19-digit card number does not fit in a float.
    integer = text.lstrip("-").partition(".")[0].partition("e")[0].partition("E")[0]
    value = float(text)
    return _CARD if is_card(integer) or card_number(value) else value


_LENIENT = json.JSONDecoder(
    # Read what the strict parser refuses (NaN): a refused body is exactly what gets here.
    # Integers too long for Python to read stay text; none is a card number.
    parse_int=lambda text: int(text) if len(text) <= 1000 else text,
    parse_float=_float,
    object_pairs_hook=_no_duplicates,
)


def _read(text: str) -> Any:
    """The body's JSON value, or None when it is not JSON (or too deep to walk safely)."""
    try:
        raw = _LENIENT.decode(text)
    except (ValueError, RecursionError, _Duplicate):  # JSONDecodeError, a number out of range
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


def _redact_json(raw: Any, text: str) -> bytes | None:
    """The JSON value redacted and written, or None when nothing in it was masked. Strings
    can only hold a card number or a quote if the text has a digit run or an escape."""
    escaped = "\\u" in text
    redactor = _Redactor(cards=escaped or has_digit_run(text), pairs=escaped or '\\"' in text)
    redacted = redactor.value(raw, 0)
    if redacted is raw:
        return None
    return json.dumps(redacted, separators=(",", ":")).encode()


def redact_body(body: bytes) -> tuple[bytes, bool]:
    """The body with payment details masked, and whether anything was. Total: any bytes at
    all give bytes back (a body that is not JSON is masked as text)."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raw = None
    else:
        raw = _read(text)
    if raw is not None:
        redacted = _redact_json(raw, text)
        return (body, False) if redacted is None else (redacted, True)
    text = body.decode("utf-8", errors="surrogateescape")
    masked = redact_pairs(redact_text(text))
    if masked == text:
        return body, False
    out = masked.encode("utf-8", errors="surrogateescape")
    # Masking may have made it JSON (a bad value was its only fault): then redact it as JSON,
    # which also masks what text cannot (nested objects under a sensitive name).
    try:
        again = out.decode("utf-8")
    except UnicodeDecodeError:
        return out, True
    raw = _read(again)
    if raw is not None:
        out = _redact_json(raw, again) or out
    return out, True


BODY_SHOWN = 4000
"""The most characters of a dead letter's body an operator is shown."""


def shown_body(body: bytes) -> str:
    """A dead letter's body as an operator sees it (`dlq show`, `GET /ops/dead-letter`): pretty
    JSON (every control escaped by `json.dumps`; payment tokens shortened, as `orders show`
    does), or else decoded with replacement characters. Not escaped yet: JSON output must keep
    it as it is; the human view escapes it."""
    body = redact_body(body)[0]  # a message the broker dead-lettered itself is not redacted yet
    try:
        text = json.dumps(shorten_tokens(json.loads(body)), indent=2)
    except (ValueError, UnicodeDecodeError, RecursionError):
        text = body.decode("utf-8", errors="replace")
    return text if len(text) <= BODY_SHOWN else text[:BODY_SHOWN] + f"… ({len(text)} chars)"
