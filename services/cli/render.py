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

And both, as `echo_json` for JSON output, mask every card number (`redact_shown`,
shared/domain/redaction.py): a message id, an error or an order's text may hold one.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import click
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table
from rich.text import Text

from shared.domain.redaction import redact_shown
from shared.domain.text import printable


def plain(value: object, *, keep_lines: bool = False) -> str:
    """`value` as text that a terminal shows as it is, card numbers masked and unsafe
    characters escaped; with `keep_lines`, line feeds are kept and every line is escaped."""
    text = redact_shown(value if isinstance(value, str) else str(value))
    if keep_lines:
        return "\n".join(printable(line) for line in text.split("\n"))
    return printable(text)


def in_words(value: object) -> str:
    """A value of the system's data (a heartbeat's status, an event's details) as a person
    reads it, never a Python repr: a mapping as `key value, key value` (a key's underscores as
    spaces; a mapping within one in parentheses), a list joined by commas, a flag as yes or no;
    a part that says nothing (None, empty) left out. Not escaped: pass it to `plain`/`shown`."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, Mapping):
        parts = []
        for key, item in value.items():
            text = in_words(item)
            if text:
                nested = isinstance(item, Mapping)
                parts.append(f"{str(key).replace('_', ' ')} {f'({text})' if nested else text}")
        return ", ".join(parts)
    if isinstance(value, list | tuple | set | frozenset):
        return ", ".join(filter(None, map(in_words, value)))
    return "" if value is None else str(value)


def shown(value: object, *, keep_lines: bool = False) -> Text:
    """`value` for rich: `plain` text, as a `Text` that rich never parses."""
    return Text(plain(value, keep_lines=keep_lines))


def echo_json(value: Any) -> None:
    """A command's `--json` output: `value` as one line of JSON, card numbers masked."""
    click.echo(json.dumps(redact_shown(value)))


def plain_console(*, stderr: bool = False) -> Console:
    """Rich output with no markup, emoji or highlighting: order ids, keys and error messages
    are printed exactly as they are (`o-1:ship:undo` is not an emoji, `[x]` not markup).
    Values from data reach it through `shown` all the same, which escapes what would drive
    the terminal (and is literal text on any console)."""
    return Console(stderr=stderr, emoji=False, markup=False, highlight=False)


WHOLE = frozenset(
    {"order", "message id", "idempotency key", "examples", "process", "step"}
    | {"kind", "state", "severity", "reason", "type", "count", "changed", "when"}
)
"""Columns whose values an operator copies or reads at a glance: never wrapped or cut short
(long free text such as error messages wraps instead)."""


def add_columns(table: Table, *names: str) -> None:
    for name in names:
        if name in WHOLE:
            table.add_column(name, no_wrap=True, overflow="fold")
        else:
            table.add_column(name, overflow="fold")


@contextmanager
def progress_bar(
    *, shown: bool = True, transient: bool = False
) -> Iterator[Callable[[str, int, int], None]]:
    """A progress bar on stderr while the block runs, told (what is counted, how many so far,
    how many in all): one bar per thing counted, added when first told. Not `shown`: nothing."""
    bar = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=plain_console(stderr=True),
        transient=transient,
        disable=not shown,
    )
    tasks: dict[str, TaskID] = {}

    def update(description: str, done: int, total: int) -> None:
        if description not in tasks:
            tasks[description] = bar.add_task(description, total=total)
        bar.update(tasks[description], completed=done)

    with bar:
        yield update


class PlainFormatter(logging.Formatter):
    """Log lines for a person's terminal (the one-shot commands' stderr): a message may quote
    anything, so each line is `plain` (a traceback keeps its lines)."""

    def format(self, record: logging.LogRecord) -> str:
        return plain(super().format(record), keep_lines=True)
