"""Text that is safe to store and to show a person. Pure: no I/O.

Two rules, one set of characters. *Unsafe* characters are the ones that drive a terminal or a
page rather than being read on it, or that a store cannot hold:

- C0 and C1 controls and DEL (general category Cc): NUL, which neither PostgreSQL's `text` and
  `jsonb` nor a BSON key can hold, ESC and the 8-bit CSI, which start terminal escape
  sequences (set the window title, clear the screen, hyperlinks), BEL, backspace, CR;
- unpaired surrogates (Cs), which are not Unicode text and which no driver can encode;
- the line and paragraph separators (Zl, Zp), which break a line where none is shown;
- the bidirectional controls (U+061C, U+200E-U+200F, U+202A-U+202E, U+2066-U+2069), which
  reorder what is displayed after them ("Trojan Source").

Free-text fields *refuse* them at validation (`refuse_unsafe`), so no accepted order holds
one. Everything shown to a person *escapes* them (`printable`), so data written before the
rule, or coming from elsewhere (a dead letter's body, a remote service's error), is shown
harmlessly. Error texts are *cleaned* and cut at construction (`clean_cut`): they are made from
exceptions, which may quote anything, and must never make a write fail; cleaning masks the card
numbers they quote too (shared/domain/redaction.py), before the cut, which would otherwise
leave the first digits of one that straddles it.
"""

from __future__ import annotations

import re
import unicodedata
from typing import Any

from pydantic import ValidationInfo

from shared.domain.redaction_text import shown_text

_BIDI = "\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069"
_UNSAFE = re.compile(f"[\x00-\x1f\x7f-\x9f\ud800-\udfff\u2028\u2029{_BIDI}]")
"""The unsafe characters (see the module docstring), as one character class."""

ELLIPSIS = "…"


def unsafe_characters(text: str) -> list[str]:
    """The distinct unsafe characters in `text`, in order of first appearance."""
    return list(dict.fromkeys(_UNSAFE.findall(text)))


def is_safe(text: str) -> bool:
    """Whether `text` holds no unsafe character (one regex search, for every message)."""
    return _UNSAFE.search(text) is None


def describe(char: str) -> str:
    """`U+001B (ESCAPE)`: a character named for an error message, never the character itself."""
    name = unicodedata.name(char, "") or _category_name(char)
    return f"U+{ord(char):04X} ({name})" if name else f"U+{ord(char):04X}"


def _category_name(char: str) -> str:
    return {"Cc": "control", "Cs": "surrogate"}.get(unicodedata.category(char), "")


def refuse_unsafe(text: str) -> str:
    """`text` unchanged, or ValueError naming its first unsafe character (a pydantic
    validator: the error becomes the field's validation error)."""
    found = _UNSAFE.search(text)
    if found is not None:
        raise ValueError(
            f"contains the control character {describe(found.group())} at position {found.start()}"
        )
    return text


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def printable(text: str) -> str:
    """`text` with every unsafe character replaced by its visible escape (`\\x1b`, `\\u202e`):
    what a terminal, a log read by a person or a page may show as it is."""
    return _UNSAFE.sub(_escape, text)


def cut(text: str, limit: int) -> str:
    """`text`, or its first `limit - 1` characters and an ellipsis when it is longer."""
    if len(text) <= limit:
        return text
    return text[: max(0, limit - 1)] + ELLIPSIS


STORED = "stored"
"""The key of pydantic's validation context that marks a record read back from a store: what
it holds was accepted when it was written, and is read as it is (shown escaped, never refused
or rewritten)."""


def is_stored(info: ValidationInfo) -> bool:
    return info.context is not None and bool(info.context.get(STORED))


def shown_cut(text: str, limit: int) -> str:
    """An error text as a log line or an answer shows it: card numbers masked and unsafe
    characters escaped, then cut to `limit` (masked first: a cut would leave the first digits
    of a card number that straddles it)."""
    return cut(printable(shown_text(text)), limit)


def clean_cut(limit: int) -> Any:
    """A pydantic before-validator for error texts: card numbers masked and unsafe characters
    escaped, then cut to `limit` characters, so a text of any length and content is stored
    instead of refused, and never holds a card number in clear."""

    def clean(value: Any, info: ValidationInfo) -> Any:
        if is_stored(info) or not isinstance(value, str):
            return value
        return shown_cut(value, limit)

    return clean
