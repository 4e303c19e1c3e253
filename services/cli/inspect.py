"""Operator commands that read: `stats`, `watch`, `alerts list|follow`, `audit` (what they
read: `services/operator/stats.py`, `alerts.py`, `audit.py`); and `alerts ack|resolve`, which
record who acted on an alert."""

from __future__ import annotations

import asyncio
import contextlib
import getpass
import signal
import sys
from collections.abc import AsyncIterator
from typing import Any

import click
from rich.console import Group
from rich.live import Live
from rich.table import Table

from services.cli.operations import run_operations
from services.cli.render import add_columns, echo_json, in_words, plain, plain_console, shown
from services.cli.settings import pass_settings
from services.operator.alerts import Feed
from services.operator.audit import audit_hub
from services.operator.operations import Operations, open_operations
from services.operator.results import AlertList, Stats, alert_row
from shared.broker.delivery import INTAKE_HEALTHY
from shared.config import Settings
from shared.domain.durations import human_age, parse_duration
from shared.domain.journal import Alert, AlertAction, AlertState
from shared.domain.timing import utcnow
from shared.errors import BadInput, NotFound


def _intake_line(intake: list[dict[str, Any]]) -> str:
    stopped = [i for i in intake if i.get("state") not in INTAKE_HEALTHY]
    if not stopped:
        return f"intake: {len(intake)} consumer(s) consuming or paused"
    parts = [
        f"{i.get('process')} on {i.get('queue')}: {i.get('state')} "
        f"(ready {i.get('ready')}, in hand {i.get('in_hand')}, idle {i.get('idle_s')} s)"
        for i in stopped
    ]
    return "intake STOPPED: " + "; ".join(parts)


def _status_text(data: dict[str, Any]) -> str:
    """A process's heartbeat data in words, leaving out what says nothing here (its pid; its
    breakers and intake, which have lines of their own)."""
    return in_words(
        {k: v for k, v in data.items() if k not in ("pid", "breakers", "agent", "intake")}
    )


def _orders_line(title: str, ids: list[str], capped: bool, cap: int) -> str:
    """`stuck Pending orders: 3 (e.g. …)`, or `1000+` when there were more than it read."""
    count = f"{cap}+" if capped else str(len(ids))
    examples = f" (e.g. {', '.join(ids[:3])})" if ids else ""
    return f"{title}: {count}{examples}"


def render_stats(result: Stats) -> Group:
    hub = result.hub
    states = Table(title=f"orders in hub {hub}")
    states.add_column("state")
    states.add_column("orders", justify="right")
    for state, n in result.by_state.items():
        states.add_row(shown(state), str(n))
    queues = Table(title="queues")
    queues.add_column("queue")
    queues.add_column("messages", justify="right")
    for queue, depth in result.queues.items():
        queues.add_row(
            shown(queue.removeprefix(f"{hub}.")), "not declared" if depth is None else str(depth)
        )
    processes = Table(title=f"{len(result.processes)} process(es) reporting")
    add_columns(processes, "process", "kind", "seen", "status")
    for p in result.processes:
        processes.add_row(shown(p.name), shown(p.kind), p.seen, shown(_status_text(p.data)))
    cap = result.count_cap
    lines = [
        f"supervisor leader: {result.leader or 'NONE (no supervisor holds the lease)'}",
        "open circuit breakers: " + (", ".join(result.open_breakers) or "none"),
        _orders_line(
            "stuck Pending orders", result.stuck_pending, result.stuck_pending_capped, cap
        ),
        _orders_line("overdue running orders", result.overdue, result.overdue_capped, cap),
        _intake_line(result.intake),
    ]
    return Group(states, queues, processes, *map(shown, lines))


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@pass_settings()
def stats(settings: Settings, as_json: bool) -> None:
    """Orders per state, stuck and overdue orders, queue depths, processes, open breakers, the
    leader. Stuck and overdue orders are counted up to 1000 (`1000+` beyond; in JSON,
    `stuck_pending_capped` / `overdue_capped`)."""
    result = run_operations(settings, _stats, name="orderflow-stats", broker=True)
    if as_json:
        echo_json(result.model_dump(mode="json"))
        return
    plain_console().print(render_stats(result))


async def _stats(ops: Operations) -> Stats:
    return await ops.stats()


async def stats_every(
    settings: Settings, interval: float, count: int | None
) -> AsyncIterator[Stats]:
    """A snapshot every `interval` seconds, `count` of them (None: until the caller stops),
    each over connections of its own: a server that goes away ends the watch with the reason
    (exit 3), where a kept connection would wait for it and show a stale view."""
    n = 0
    while count is None or n < count:
        if n:
            await asyncio.sleep(interval)
        async with open_operations(settings, name="orderflow-stats", broker=True) as ops:
            snapshot = await ops.stats()
        yield snapshot
        n += 1


@click.command()
@click.option(
    "--interval", default=2.0, show_default=True, type=click.FloatRange(min=0.2), help="Seconds."
)
@click.option("--count", type=click.IntRange(min=1), help="Stop after this many refreshes.")
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print one JSON object per line per refresh (as `stats --json`) instead of a live view.",
)
@pass_settings()
def watch(settings: Settings, interval: float, count: int | None, as_json: bool) -> None:
    """A live view of `stats` that refreshes until Ctrl-C (or `--count` refreshes)."""

    async def live_view() -> None:
        with Live(console=plain_console(), auto_refresh=False) as live:
            async for result in stats_every(settings, interval, count):
                live.update(render_stats(result), refresh=True)

    async def json_lines() -> None:
        async for result in stats_every(settings, interval, count):
            echo_json(result.model_dump(mode="json"))
            sys.stdout.flush()  # a reader of a pipe sees each refresh as it comes

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(json_lines() if as_json else live_view())


@click.group()
def alerts() -> None:
    """Conditions an operator must act on."""


@alerts.command("list")
@click.option("--since", help="Only alerts younger than this (90s, 15m, 2h, 1d).")
@click.option(
    "--limit",
    default=100,
    show_default=True,
    type=click.IntRange(1, 10_000),
    help="Most alerts to list.",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@pass_settings()
def alerts_list(settings: Settings, since: str | None, limit: int, as_json: bool) -> None:
    """Alerts, newest first."""
    try:
        after = None if since is None else utcnow() - parse_duration(since)
    except ValueError as exc:
        raise BadInput(str(exc)) from None

    found = run_operations(settings, lambda ops: ops.alerts(after, limit))
    if as_json:
        echo_json(AlertList(alerts=[alert_row(a, s) for a, s in found]).model_dump(mode="json"))
        return
    now = utcnow()
    table = Table(title=f"{len(found)} alert(s), newest first")
    add_columns(table, "when", "id", "kind", "severity", "order", "state", "message")
    for a, state in found:
        table.add_row(
            human_age(a.at, now),
            shown(a.alert_id),
            a.kind.value,
            a.severity.value,
            shown(a.order_id or ""),
            shown(_state_line(state)),
            shown(a.message[:90]),
        )
    plain_console().print(table)


def _state_line(state: AlertState) -> str:
    if state.resolved_at is not None:
        return f"resolved by {state.resolved_by}"
    if state.acknowledged_at is not None:
        return f"acknowledged by {state.acknowledged_by}"
    return "open"


def _mark(settings: Settings, alert_ids: tuple[str, ...], action: AlertAction, by: str) -> None:

    async def mark_each(ops: Operations) -> dict[str, AlertState | None]:
        states: dict[str, AlertState | None] = {}
        at = utcnow()  # one command, one moment for all its alerts
        for alert_id in alert_ids:
            try:
                states[alert_id] = await ops.mark_alert(alert_id, action, by=by, at=at)
            except NotFound:
                states[alert_id] = None  # said once all are marked
        return states

    states = run_operations(settings, mark_each)
    done = "acknowledged" if action is AlertAction.ACKNOWLEDGE else "resolved"
    missing = [i for i, s in states.items() if s is None]
    for alert_id, state in states.items():
        if state is not None:
            at = state.at(action)
            when = at.isoformat() if at is not None else "?"
            click.echo(plain(f"{alert_id} {done} by {state.by(action)} at {when}"))
    if missing:
        raise BadInput(
            f"no alert {', '.join(repr(i) for i in missing)} (see `orderflow alerts list`)"
        )


by_option = click.option(
    "--by",
    default=None,
    help="Who acts (default: the user running the command).",
)


@alerts.command("ack")
@click.argument("alert_ids", nargs=-1, required=True)
@by_option
@pass_settings()
def alerts_ack(settings: Settings, alert_ids: tuple[str, ...], by: str | None) -> None:
    """Record that you (or --by WHO) are on these alerts: the notifier sends PagerDuty an
    `acknowledge` of each one's incident. The first acknowledgement of an alert stands."""
    _mark(settings, alert_ids, AlertAction.ACKNOWLEDGE, by or getpass.getuser())


@alerts.command("resolve")
@click.argument("alert_ids", nargs=-1, required=True)
@by_option
@pass_settings()
def alerts_resolve(settings: Settings, alert_ids: tuple[str, ...], by: str | None) -> None:
    """Record that these alerts' conditions are over: the notifier sends PagerDuty a `resolve`
    of each one's incident. The first resolution of an alert stands."""
    _mark(settings, alert_ids, AlertAction.RESOLVE, by or getpass.getuser())


@alerts.command("undelivered")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@pass_settings()
def alerts_undelivered(settings: Settings, as_json: bool) -> None:
    """The notifier's dead letters: alerts (and acknowledgements, resolutions) a webhook refused
    for good or that failed until the notifier gave up, oldest first, with why."""
    rows = run_operations(
        settings,
        lambda ops: ops.undelivered_alerts(),
        name="orderflow-alerts",
        store=False,
        broker=True,
    )
    if as_json:
        echo_json({"undelivered": [row.model_dump(mode="json") for row in rows]})
        return
    table = Table(title=f"{len(rows)} notice(s) not delivered, oldest first")
    add_columns(table, "age", "target", "reason", "notice", "error")
    for row in rows:
        table.add_row(
            shown(row.age or ""),
            shown(str(row.target or "-")),
            shown(str(row.reason or "")),
            shown(row.message_id or ""),
            shown(str(row.error or "")[:120]),
        )
    plain_console().print(table)


@alerts.command("follow")
@click.option("--burst", is_flag=True, help="Exit once the queue is empty (else until Ctrl-C).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per alert and line.")
@pass_settings()
def alerts_follow(settings: Settings, burst: bool, as_json: bool) -> None:
    """Take alert notifications from <hub>.alerts.feed as they come, oldest first (each one is
    acknowledged once printed: the queue's reader, for a pager integration to pipe from; the
    queue keeps the newest ORDERFLOW_ALERTS_QUEUE_MAX_LENGTH while nobody reads)."""

    def show(alert: Alert) -> None:
        if as_json:
            echo_json(alert.model_dump(mode="json"))
        else:
            click.echo(
                plain(
                    f"{alert.at.isoformat()} {alert.kind.value} {alert.severity.value} "
                    f"{alert.order_id or '-'} {alert.message}"
                )
            )
        sys.stdout.flush()  # a reader of a pipe sees each alert as it comes

    def refused(why: str) -> None:
        click.echo(plain(why), err=True)

    async def follow() -> int:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
        async with open_operations(
            settings, name="orderflow-alerts", store=False, broker=True
        ) as ops:
            return await ops.follow_alerts(Feed(show, refused), burst=burst, stop=stop)

    taken = asyncio.run(follow())
    if not as_json:
        click.echo(f"{taken} alert(s) taken", err=True)


@click.command()
@click.option(
    "--grace",
    default=60.0,
    show_default=True,
    help="Seconds a live attempt may be past its deadline before it counts as lost.",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@pass_settings()
def audit(settings: Settings, grace: float, as_json: bool) -> None:
    """Check the invariants (docs/design.md §5) against the store, the remote ledger and the
    dead- letter queues (exit 1 on any violation): 1 every order settled or recoverable; 2 one
    effect per step, every effect of a compensated order undone; 3 no write or effect by a
    superseded attempt; 4 no order's data replaced after its first submission; 5 every dead
    letter has a reason; 6 no order's remote attempts beyond its retry budget, nor an undo
    request's beyond ORDERFLOW_UNDO_ATTEMPTS. (That each process keeps running after bad input is
    for the fault suite to show.)"""
    result = asyncio.run(audit_hub(settings, grace)).to_json()
    if as_json:
        echo_json(result)
    else:
        click.echo(
            plain(
                f"{result['orders']} orders, {result['effects']} ledger effects, "
                f"{result['attempts']} remote attempts, "
                f"{result['dead_letters']} dead letters; "
                + ", ".join(f"{k}: {v}" for k, v in result["by_state"].items())
            )
        )
        for v in result["violations"]:
            click.echo(
                plain(f"violation of invariant {v['invariant']}: {v['order_id']}: {v['message']}")
            )
        click.echo(
            "audit: ok" if result["ok"] else f"audit: {len(result['violations'])} violation(s)"
        )
    if not result["ok"]:
        sys.exit(1)
