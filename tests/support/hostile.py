"""Text that would drive an operator's terminal or restyle rich output if shown raw, and the
check that an output shows it harmlessly."""

from __future__ import annotations

import re

from shared.domain.text import unsafe_characters

TITLE = "\x1b]0;pwned\x07"
"""OSC 0: sets the terminal window's title (BEL ends it)."""
CLEAR = "\x1b[2J"
"""CSI 2 J: clears the screen."""
CSI8 = "\x9b31m"
"""The 8-bit CSI: red text on terminals that take C1 controls."""
RLO = "\u202e"
"""Right-to-left override: reorders what follows it."""
NUL = "\x00"
LINK = "[link=https://evil.example]x[/link]"
"""rich markup: a live hyperlink if rich reads it."""

HOSTILE = f"{TITLE}{CLEAR}{CSI8}{RLO}{LINK}"
"""All of them but NUL, which neither PostgreSQL text nor jsonb can hold."""
ESCAPED = ["\\x1b]0;pwned\\x07", "\\x1b[2J", "\\x9b31m", "\\u202e", LINK]
"""How HOSTILE's parts look once shown: visible escapes, and the markup as it is."""
RAW = ["\x1b", "\x07", "\x9b", "\u202e", "\x00"]

_RICH_STYLE = re.compile(r"\x1b\[(?:[0-9;]*m|\?25[lh]|2K|1A)")
"""The only escapes rich itself writes for these commands: SGR styles, and for a live view
cursor hide and show, erase line and cursor up. HOSTILE holds none of them, so taking them out
of an output hides none of its parts."""


def assert_harmless(output: str, *, styled: bool = False) -> None:
    """No raw control or bidi character in `output` (line feeds aside). `styled`: the output
    of a console that believed it wrote to a terminal, whose own escapes are allowed."""
    text = _RICH_STYLE.sub("", output) if styled else output
    for raw in RAW:
        assert raw not in text, f"raw {raw!r} in the output: {output!r}"
    assert set(unsafe_characters(text)) <= {"\n"}, f"unsafe characters in {output!r}"
    assert "\x1b]8;" not in output, f"a live hyperlink in {output!r}"


def assert_escaped(output: str, parts: list[str] = ESCAPED) -> None:
    """Each part of HOSTILE visible in `output` as its escape (the markup literally)."""
    for part in parts:
        assert part in output, f"{part!r} not shown in {output!r}"
