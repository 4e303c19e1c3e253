"""Text safe to store and to show: unsafe characters refused, escaped, or cleaned and cut."""

from __future__ import annotations

from typing import Annotated

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BeforeValidator, TypeAdapter

from shared.domain.text import (
    ELLIPSIS,
    STORED,
    clean_cut,
    cut,
    printable,
    refuse_unsafe,
    shown_cut,
    unsafe_characters,
)

UNSAFE = [
    "\x00",  # NUL: no PostgreSQL text, no BSON key
    "\x1b",  # ESC: terminal escape sequences
    "\x07",
    "\r",
    "\n",
    "\x7f",
    "\x9b",  # the 8-bit CSI
    "\ud800",  # an unpaired surrogate
    "\u2028",
    "\u202e",  # right-to-left override
    "\u2066",
]


@pytest.mark.parametrize("char", UNSAFE, ids=lambda c: f"U+{ord(c):04X}")
def test_unsafe_characters_are_refused_named_and_escaped(char: str) -> None:
    text = f"a{char}b"
    with pytest.raises(ValueError, match=f"U\\+{ord(char):04X}") as caught:
        refuse_unsafe(text)
    assert char not in str(caught.value)  # the error names it, never carries it
    assert unsafe_characters(text) == [char]
    shown = printable(text)
    assert shown.startswith("a\\") and shown.endswith("b") and char not in shown


@pytest.mark.parametrize(
    "text",
    ["Zoë Ångström", "東京都", "O'Brien & Söhne", "emoji 👍🏽", "zwj 👩\u200d💻", "plain"],
)
def test_ordinary_text_passes_unchanged(text: str) -> None:
    assert refuse_unsafe(text) == text
    assert printable(text) == text


def test_a_terminal_attack_is_shown_harmlessly() -> None:
    attack = "\x1b]0;pwned\x07\x1b[2J\x1b[1;1H"
    shown = printable(attack)
    assert shown == "\\x1b]0;pwned\\x07\\x1b[2J\\x1b[1;1H"


@given(st.text())
def test_printable_leaves_nothing_unsafe(text: str) -> None:
    shown = printable(text)
    assert unsafe_characters(shown) == []
    refuse_unsafe(shown)
    shown.encode("utf-8")  # no unpaired surrogate survives


@given(st.text(), st.integers(min_value=1, max_value=50))
def test_cut_never_exceeds_the_limit(text: str, limit: int) -> None:
    out = cut(text, limit)
    assert len(out) <= limit
    assert out == text or out.endswith(ELLIPSIS)


CLEANED = TypeAdapter(Annotated[str | None, BeforeValidator(clean_cut(200))])


@given(st.text(max_size=5000))
def test_clean_cut_makes_any_text_storable(text: str) -> None:
    cleaned = CLEANED.validate_python(text)
    assert cleaned is not None and len(cleaned) <= 200 and unsafe_characters(cleaned) == []
    assert CLEANED.validate_python(None) is None


def test_a_stored_text_is_read_as_it_is() -> None:
    raw = "\x1b]0;old\x07"
    assert CLEANED.validate_python(raw, context={STORED: True}) == raw
    assert CLEANED.validate_python(raw) == "\\x1b]0;old\\x07"


def test_a_shown_cut_masks_before_it_cuts() -> None:
    # A card number across the cut: cutting first would leave its first digits in clear.
    text = "x" * 290 + " 4111 1111 1111 1111 and more"
    shown = shown_cut(text, 300)
    assert len(shown) <= 300 and "4111" not in shown
    assert "4111" in cut(text, 300)  # what the plain cut shows
