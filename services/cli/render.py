"""What the operator's commands show of data: escaped, so that stored or received text can
neither drive the terminal nor restyle what rich prints.

Every value that comes from data (the store, the broker, a remote service, a child process),
not from the code, passes through one of these on its way to a person:

- `shown(value)` for rich (table cells, console lines): a `Text`, which rich prints as it is
  whatever the console's settings: never read as markup (`[link=…]`), emoji or highlighted.
  (`rich.markup.escape` would be wrong here: the consoles print strings without markup, so its
  backslashes would show.)
- `plain(value)` for `click.echo` and for text composed before it reaches rich.

Both replace every unsafe character (controls, bidi controls, …; `shared.domain.text`) by a
visible escape such as `\\x1b` or `\\u202e`. A line break is escaped too (`\\x0a`), so a value
cannot fake a row or a line of its own, unless `keep_lines` asks to keep line feeds in a text
shown as several lines (a message body). JSON output needs neither: `json.dumps` escapes every
non-ASCII character and control (its default `ensure_ascii=True`).
"""

from __future__ import annotations

import logging
from typing import Any

from rich.text import Text

from shared.domain.text import printable


def plain(value: object, *, keep_lines: bool = False) -> str:
    """`value` as text that a terminal shows as it is, unsafe characters escaped; with
    `keep_lines`, line feeds are kept and every line is escaped."""
    text = value if isinstance(value, str) else str(value)
    if keep_lines:
        return "\n".join(printable(line) for line in text.split("\n"))
    return printable(text)


def shown(value: object, *, keep_lines: bool = False) -> Text:
    """`value` for rich: `plain` text, as a `Text` that rich never parses."""
    return Text(plain(value, keep_lines=keep_lines))


class PlainFormatter(logging.Formatter):
    """Log lines for a person's terminal (the one-shot commands' stderr): a message may quote
    anything, so each line is `plain` (a traceback keeps its lines)."""

    def format(self, record: logging.LogRecord) -> str:
        return plain(super().format(record), keep_lines=True)


TOKEN_SHOWN = 8
"""Characters of a payment token shown: enough to tell two apart, never the whole."""


def short_token(token: str) -> str:
    """A payment token as every command shows it: its start only."""
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
