"""`orderflow dlq list|show|replay|purge`: the dead-lettered messages of each input queue.

What each does to the queues (reading never loses a message; a replay goes back through the
queue's replay exchange with its original message id, removed from the DLQ once confirmed) is
`shared/broker/dead_letters.py`; this module prints it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

import click
from rich.table import Table

from services.cli.operations import run_operations
from services.cli.render import add_columns, echo_json, plain, plain_console, shown
from services.cli.settings import pass_settings
from services.operator.operations import Operations
from services.operator.results import DeadLetters, ReplayResult, ShownDeadLetters
from shared.broker.dead_letters import source_queues
from shared.broker.topology import Names
from shared.config import Settings
from shared.errors import BadInput

T = TypeVar("T")


def _on_broker(
    settings: Settings, queue: str | None, action: Callable[[Operations], Awaitable[T]]
) -> T:
    """`action` on the broker, once `queue` is known to name an input queue (a bad name is
    refused before anything connects)."""
    source_queues(Names(settings.hub), queue)
    return run_operations(settings, action, name="orderflow-dlq", store=False, broker=True)


queue_option = click.option("--queue", help="One input queue (orders, payment, …); default all.")


@click.group()
def dlq() -> None:
    """Dead-lettered messages per input queue: list, show, replay, purge."""


@dlq.command("list")
@queue_option
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@pass_settings()
def list_cmd(settings: Settings, queue: str | None, as_json: bool) -> None:
    """Dead-lettered messages with their reasons (the messages stay where they are)."""
    rows = _on_broker(settings, queue, lambda ops: ops.dead_letters(queue))
    if as_json:
        echo_json(DeadLetters(messages=rows).model_dump(mode="json"))
        return
    table = Table(title=f"{len(rows)} dead-lettered message(s) in hub {settings.hub}")
    add_columns(table, "queue", "message id", "type", "reason", "error", "dead-lettered")
    for r in rows:
        table.add_row(
            shown(r.queue.removeprefix(f"{settings.hub}.")),
            shown(r.message_id),
            shown(r.type),
            shown(r.reason),
            shown(str(r.error or "")[:60]),
            r.age,
        )
    plain_console().print(table)


@dlq.command("show")
@click.argument("message_id")
@queue_option
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@pass_settings()
def show_cmd(settings: Settings, message_id: str, queue: str | None, as_json: bool) -> None:
    """One dead-lettered message: its reason, headers and body."""
    found = _on_broker(settings, queue, lambda ops: ops.dead_letter(message_id, queue))
    if as_json:
        echo_json(ShownDeadLetters(messages=found).model_dump(mode="json"))
        return
    for row in found:
        click.echo(plain(f"{row.message_id} on {row.queue} ({row.type}, {row.bytes} bytes)"))
        click.echo(plain(f"  reason: {row.reason}: {row.error}"))
        click.echo(plain(f"  dead-lettered {row.age} after {row.deliveries} delivery(ies)"))
        # Its lines indented, so that no line of a body can pass for a line of this report.
        click.echo("  body: " + plain(row.body, keep_lines=True).replace("\n", "\n    "))


@dlq.command("replay")
@click.argument("message_ids", nargs=-1)
@click.option("--all", "replay_all", is_flag=True, help="Every message of the queue(s).")
@queue_option
@click.option("--by", default="operator", show_default=True, help="Recorded in a header.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@pass_settings()
def replay_cmd(
    settings: Settings,
    message_ids: tuple[str, ...],
    replay_all: bool,
    queue: str | None,
    by: str,
    as_json: bool,
) -> None:
    """Send dead-lettered messages back to their source queue, with their original message id."""
    if bool(message_ids) == replay_all:
        raise BadInput("name the messages to replay, or give --all")
    wanted = None if replay_all else set(message_ids)
    outcome = _on_broker(settings, queue, lambda ops: ops.replay(wanted, queue, by=by))
    _report_replay(outcome, as_json=as_json)
    if outcome.not_found or outcome.unsealed:
        raise SystemExit(1)


def _report_replay(outcome: ReplayResult, *, as_json: bool) -> None:
    done, unsealed, missing = outcome.replayed, outcome.unsealed, outcome.not_found
    if as_json:
        echo_json({"replayed": done, "not_found": missing, "unsealed": unsealed})
        return
    for d in done:
        click.echo(plain(f"{d['message_id']}: replayed to {d['queue']}"))
    for u in unsealed:
        click.echo(
            plain(
                f"{u['message_id']}: not replayed, left in {u['queue']}.dlq: it has no seal "
                "of its consumer's (the broker dead-lettered it, or an older release did), "
                "and its consumer takes no unsealed message from the operator; resubmit it "
                "from its sender"
            ),
            err=True,
        )
    for message_id in missing:
        click.echo(plain(f"{message_id}: not found in a dead-letter queue"), err=True)
    click.echo(f"{len(done)} replayed")


@dlq.command("purge")
@queue_option
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON: the messages deleted per DLQ.")
@pass_settings()
def purge_cmd(settings: Settings, queue: str | None, yes: bool, as_json: bool) -> None:
    """Delete dead-lettered messages for good (asks first, on stderr, unless --yes)."""
    dlqs = [Names.dlq(source) for source in source_queues(Names(settings.hub), queue)]
    if not yes:
        # The question goes to stderr: stdout stays the report (JSON with --json).
        click.confirm(f"Delete every message in {', '.join(dlqs)} for good?", abort=True, err=True)
    purged = _on_broker(settings, queue, lambda ops: ops.purge(queue))
    if as_json:
        echo_json({"purged": purged})
        return
    for name, n in purged.items():
        click.echo(f"{name}: {n} message(s) deleted")
