"""What the operator's commands show of data: escaped for the terminal, literal for rich."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import sys
from datetime import timedelta
from typing import Any

import click
import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st
from rich.console import Console
from rich.table import Table

from services.cli import up
from services.cli.inspect import render_stats
from services.cli.main import OrderflowGroup
from services.cli.order_actions import report
from services.cli.orders import _print_groups, _print_show
from services.cli.render import PlainFormatter, plain, plain_console, shown
from services.operator.explain import group_failures
from services.operator.results import OrderView, Stats
from shared.domain.models import ErrorInfo
from shared.domain.states import ErrorKind, ProcessState
from shared.domain.text import unsafe_characters
from shared.domain.timing import utcnow
from shared.errors import OrderflowError
from shared.telemetry import JsonFormatter
from tests.support.factories import order_pair
from tests.support.hostile import (
    CLEAR,
    CSI8,
    HOSTILE,
    LINK,
    NUL,
    RLO,
    TITLE,
    assert_escaped,
    assert_harmless,
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


@pytest.fixture
def terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    """The commands' consoles write as to a terminal (styles and all), 200 columns wide."""
    monkeypatch.setenv("FORCE_COLOR", "1")
    monkeypatch.setenv("TERM", "xterm-256color")
    monkeypatch.setenv("COLUMNS", "200")


def _show_result() -> OrderView:
    """`orders show`'s data for the human view, with hostile text wherever data goes."""
    error = {"kind": "permanent", "message": f"declined {HOSTILE}", "at": "2026-12-01T00:00:00"}
    step = {
        "step": f"ship{RLO}",
        "status": "Failed",
        "attempts": 1,
        "allowance": 1,
        "started_at": None,
        "completed_at": None,
        "seconds": None,
    }
    return OrderView.model_validate(
        {
            "order_id": "o-1",
            "received_at": "2026-12-01T00:00:00+00:00",
            "order": {
                "customer_id": f"c-{HOSTILE}",
                "lines": [{"quantity": 1, "unit_price_cents": 100}],
                "currency": f"EU{CSI8}",
                "payment_token": "tok_abcd…",
                "shipping_address": {"country": "GB", "postal_code": f"SW1{CLEAR}"},
            },
            "state": {
                "process_state": "Error",
                "workflow": f"order{TITLE} v1",
                "attempt": 1,
                "failure_count": 1,
                "failure_threshold": 3,
                "retry_budget": {"used": 1, "limit": 10, "remaining": 9},
                "locked_by": f"o-1:1{TITLE}",
                "owner": f"scheduler{LINK}",
                "complete_by": None,
                "next_attempt_at": "2026-12-01T00:00:00+00:00",
                "reply_to": None,
                "error": error,
                "created_at": "2026-12-01T00:00:00+00:00",
                "updated_at": "2026-12-01T00:00:00+00:00",
                "steps": [step | {"error": error}],
                "next": f"parked for an operator: {HOSTILE}",
            },
            "compensation": [
                {
                    "step": "ship",
                    "undo": f"cancel{CLEAR}",
                    "status": "Pending",
                    "idempotency_key": LINK,
                }
            ],
        }
    )


@pytest.mark.usefixtures("terminal")
def test_orders_show_writes_no_control_of_the_data(capsys: pytest.CaptureFixture[str]) -> None:
    _print_show(_show_result())
    out = capsys.readouterr().out
    assert "\x1b[" in out  # rich did write to "a terminal": its own styles are there
    assert_harmless(out, styled=True)
    assert_escaped(out)
    assert "customer c-\\x1b]0;pwned\\x07" in out and "EU\\x9b31m" in out


@pytest.mark.usefixtures("terminal")
def test_failure_groups_write_no_control_of_the_data(capsys: pytest.CaptureFixture[str]) -> None:
    _, record = order_pair("o-1")
    error = ErrorInfo.model_construct(kind=ErrorKind.PERMANENT, message=HOSTILE, at=utcnow())
    parked = record.model_copy(update={"process_state": ProcessState.ERROR, "error": error})
    _print_groups(group_failures([parked]), utcnow() + timedelta(seconds=1), as_json=False)
    out = capsys.readouterr().out
    assert_harmless(out, styled=True)
    # Fingerprinted first (its digits are `#`), escaped as it is shown.
    assert "\\x1b]#;pwned\\x07\\x1b[#J\\x9b#m\\u202e" + LINK in out


@pytest.mark.usefixtures("terminal")
def test_stats_write_no_control_of_the_data(capsys: pytest.CaptureFixture[str]) -> None:
    result = Stats(
        **{
            "hub": "shop",
            "at": "2026-12-01T00:00:00+00:00",
            "by_state": {"Error": 1},
            "queues": {f"shop.orders{RLO}": 0},
            "processes": [
                {"name": f"s-1{TITLE}", "kind": LINK, "seen": "1s ago", "data": {"note": CLEAR}}
            ],
            "leader": f"s-1{CSI8}",
            "open_breakers": [f"s-1: inventory.reserve{LINK}"],
            "stuck_pending": [f"o-1{RLO}"],
            "stuck_pending_capped": False,
            "overdue": [],
            "overdue_capped": False,
            "count_cap": 1000,
            "intake": [],
        }
    )
    plain_console().print(render_stats(result))
    out = capsys.readouterr().out
    assert_harmless(out, styled=True)
    assert_escaped(out)


@pytest.mark.parametrize(
    ("data", "words"),
    [
        ({"leader": False, "retention": {"passes": {}, "batches": {}, "deleted": {}}}, "leader no"),
        (
            {"leader": True, "retention": {"passes": {"inbox": 3}, "deleted": {"inbox": 120}}},
            "leader yes, retention (passes (inbox 3), deleted (inbox 120))",
        ),
        ({"paused": False, "backlog": 0, "metrics_port": None}, "paused no, backlog 0"),
        (
            {"open_breakers": ["inventory.reserve", "payment.charge"]},
            "open breakers inventory.reserve, payment.charge",
        ),
        ({"inflight": 2, "started": 40}, "inflight 2, started 40"),
    ],
)
def test_stats_show_each_process_status_in_words(
    capsys: pytest.CaptureFixture[str], data: dict[str, Any], words: str
) -> None:
    """What each kind of process reports (its heartbeat), never as a Python dict or flag."""
    row = {"name": "p-1", "kind": "supervisor", "seen": "1s ago", "data": data | {"pid": 7}}
    result = Stats(
        hub="shop",
        at="2026-12-01T00:00:00+00:00",
        by_state={"Error": 0},
        queues={},
        processes=[row],  # type: ignore[list-item]
        leader=None,
        open_breakers=[],
        stuck_pending=[],
        stuck_pending_capped=False,
        overdue=[],
        overdue_capped=False,
        count_cap=1000,
        intake=[],
    )
    Console(width=400, file=sys.stdout).print(render_stats(result))
    out = capsys.readouterr().out
    for python in ("{", "}", "[", "]", "True", "False", "None", "'"):
        assert python not in out
    assert words in out
    assert "pid" not in out


def test_action_reports_write_no_control(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        report([("o-1", f"refused: {HOSTILE}")], as_json=False, dry_run=False)
    out = capsys.readouterr().out
    assert_harmless(out)
    assert_escaped(out)


async def test_up_copies_its_childrens_lines_escaped(capsys: pytest.CaptureFixture[str]) -> None:
    stream = asyncio.StreamReader()
    stream.feed_data(f'{{"event": "ok"}}\nraw {HOSTILE}\r\n'.encode() + b"\xff\x9b2J\n last")
    stream.feed_eof()
    await up._pump("scheduler-1", stream, 12)
    lines = capsys.readouterr().out.split("\n")
    assert lines == [
        'scheduler-1  | {"event": "ok"}',
        f"scheduler-1  | raw {plain(HOSTILE)}\\x0d",
        "scheduler-1  | \ufffd\ufffd2J",  # not UTF-8: replacement characters, never raw bytes
        "scheduler-1  |  last",
        "",
    ]


def test_an_error_line_is_escaped() -> None:
    @click.group(cls=OrderflowGroup)
    def group() -> None:
        pass

    @group.command()
    def fail() -> None:
        raise OrderflowError(f"the remote said {HOSTILE}")

    result = CliRunner().invoke(group, ["fail"])
    assert result.exit_code == 1
    assert_harmless(result.stderr)
    assert_escaped(result.stderr)


async def test_up_goes_on_after_a_line_longer_than_its_reader_takes(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The pump used to stop at a line over 64 KiB, and the child then blocked on a full pipe."""
    stream = asyncio.StreamReader()
    stream.feed_data(b"x" * 200_000 + b"\nafter\n")
    stream.feed_eof()
    await up._pump("agent", stream, 5)
    lines = capsys.readouterr().out.split("\n")
    assert lines == ["agent | (a line longer than 64 KiB left out)", "agent | after", ""]


def test_dead_letter_headers_a_sender_wrote_as_bytes_are_listed_and_replayed_as_text() -> None:
    from types import SimpleNamespace

    from shared.broker import dead_letters

    message = SimpleNamespace(
        headers={
            "x-orderflow-error": b"\xff\x1b[2J",
            "x-note": b"\xfe",
            "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        },
        message_id="m",
        type="order.submit",
        body=b"{}",
        correlation_id=None,
        reply_to=None,
        content_type=None,
    )
    row = dead_letters.describe("h.orders", message, utcnow())  # type: ignore[arg-type]
    assert row["error"] == "\\xff\\x1b[2J"
    json.dumps(row)  # a bytes value made the listing fail with a TypeError
    replay = dead_letters.replayable(message, "alice")  # type: ignore[arg-type]
    assert "x-note" not in replay.headers and replay.headers["traceparent"].startswith("00-")


def test_a_dead_letter_the_broker_made_itself_is_described_by_the_broker_not_its_headers() -> None:
    """A message that expired in the orders queue reaches its DLQ as its sender wrote it: the
    sender's `x-orderflow-…` headers are not taken for ours, and its card data is masked."""
    from types import SimpleNamespace

    from shared.broker import dead_letters
    from shared.domain.redaction import shown_body

    at = utcnow()
    message = SimpleNamespace(
        headers={
            "x-orderflow-reason": "operator-approved",
            "x-orderflow-error": "nothing wrong",
            "x-orderflow-source-queue": "h.agent.payment",
            "x-death": [{"reason": "expired", "queue": "h.orders", "time": at, "count": 1}],
        },
        message_id="m",
        type="order.submit",
        body=b'{"card": "4111 1111 1111 1111"}',
    )
    row = dead_letters.describe("h.orders", message, utcnow())  # type: ignore[arg-type]
    assert row["reason"] == "broker-expired" and row["source_queue"] == "h.orders"
    assert "nothing wrong" not in str(row) and row["dead_lettered_at"] == at.isoformat()
    assert "4111 1111" not in shown_body(message.body)
