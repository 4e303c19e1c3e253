"""What the operator's commands show of data: escaped for the terminal, literal for rich."""

from __future__ import annotations

import io
import json
import logging
import sys
from typing import Any

from hypothesis import given
from hypothesis import strategies as st
from rich.console import Console
from rich.table import Table

from services.cli.render import PlainFormatter, plain, shown
from shared.domain.text import unsafe_characters
from shared.telemetry import JsonFormatter
from tests.support.hostile import (
    CLEAR,
    CSI8,
    HOSTILE,
    LINK,
    NUL,
    RLO,
    TITLE,
)

PARTS = [TITLE, CLEAR, CSI8, RLO, NUL, LINK, "[bold red]", "[/]", ":smile:", "\\", "\n", "\t"]
texts = st.one_of(
    st.text(st.characters(exclude_categories=[])),  # every code point, surrogates too
    st.lists(st.one_of(st.sampled_from(PARTS), st.text(max_size=3))).map("".join),
)
BIDI = "\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"


def consoles(buffer: io.StringIO) -> list[Console]:
    """Consoles that believe they write to a terminal: rich's defaults (markup, emoji and
    highlighting on) and the commands' `plain_console` settings (all off)."""
    wide: dict[str, Any] = {"file": buffer, "force_terminal": True, "width": 100_000}
    return [
        Console(**wide, color_system="truecolor"),
        Console(**wide, color_system="truecolor", markup=False, emoji=False, highlight=False),
    ]


@given(texts)
def test_a_shown_value_is_printed_as_its_plain_text_on_any_console(text: str) -> None:
    for console in consoles(buffer := io.StringIO()):
        console.print(shown(text), soft_wrap=True)
        printed = buffer.getvalue()
        buffer.truncate(0)
        buffer.seek(0)
        # Exactly the escaped text: no markup read, no emoji, no style, no character dropped.
        assert printed == plain(text) + "\n"
        for char in ("\x1b", "\x9b", "\x07", *BIDI):
            assert char not in printed


@given(texts)
def test_a_shown_value_in_a_table_cell_writes_no_control(text: str) -> None:
    for console in consoles(buffer := io.StringIO()):
        table = Table(show_header=False)
        table.add_row(shown(text))
        console.print(table)
        assert set(unsafe_characters(buffer.getvalue())) <= {"\n"}


@given(texts)
def test_plain_text_holds_no_unsafe_character(text: str) -> None:
    assert unsafe_characters(plain(text)) == []
    kept = plain(text, keep_lines=True)
    assert set(unsafe_characters(kept)) <= {"\n"}
    assert kept.count("\n") == text.count("\n")  # only its own line feeds, kept


def test_escapes_are_visible_and_markup_is_literal() -> None:
    assert plain(f"c-{TITLE}") == "c-\\x1b]0;pwned\\x07"
    assert plain(f"{CLEAR}{CSI8}{RLO}") == "\\x1b[2J\\x9b31m\\u202e"
    assert plain(f"a{NUL}b\nc") == "a\\x00b\\x0ac"
    assert plain(42) == "42" and plain(None) == "None"
    buffer = io.StringIO()
    console = Console(file=buffer, force_terminal=True, width=200)  # markup on
    console.print(shown(LINK))
    assert buffer.getvalue() == LINK + "\n"
    # What the check guards against: the same text as a string becomes a live hyperlink.
    console.print(LINK)
    assert "\x1b]8;" in buffer.getvalue()


def test_one_shot_commands_log_lines_escaped_and_tracebacks_keep_their_lines() -> None:
    try:
        raise ValueError(f"boom {CLEAR}")
    except ValueError:
        record = logging.LogRecord(
            "x", logging.WARNING, __file__, 1, "got %s", (TITLE,), sys.exc_info()
        )
    line = PlainFormatter("%(levelname)s %(name)s: %(message)s").format(record)
    assert line.startswith("WARNING x: got \\x1b]0;pwned\\x07\nTraceback")
    assert "ValueError: boom \\x1b[2J" in line
    assert set(unsafe_characters(line)) <= {"\n"}


def test_process_logs_are_ascii_json_lines() -> None:
    """The processes' logs need no escaping: `json.dumps` (ensure_ascii) escapes every control,
    C1 and bidi character, and `default=str` values are encoded the same way."""
    record = logging.LogRecord("x", logging.WARNING, __file__, 1, "got %s", (HOSTILE,), None)
    record.error = ValueError(f"{NUL}{CSI8}")  # an `extra=` field that is not JSON
    line = JsonFormatter(process=f"p{RLO}", hub="h").format(record)
    assert line.isascii() and "\n" not in line
    assert json.loads(line)["event"] == f"got {HOSTILE}"
