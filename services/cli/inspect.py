"""Operator commands that read: `stats`, `watch`, `alerts list|follow`, `audit`."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import sys
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import click
from rich.console import Group
from rich.live import Live
from rich.table import Table

from services.cli.alert_feed import Feed, follow_alerts
from services.cli.audit import audit as run_audit
from services.cli.audit import check_dead_letters
from services.cli.dlq import dead_letters
from services.cli.explain import add_columns, human_age, parse_duration, plain_console
from services.cli.render import plain, shown
from services.cli.settings import pass_settings
from services.remote.admin import admin_token
from services.remote.client import RemoteClient
from services.supervisor.service import LEASE
from shared.bootstrap import open_broker
from shared.broker.delivery import INTAKE_HEALTHY
from shared.broker.topology import Names
from shared.config import Settings
from shared.domain.journal import Alert
from shared.domain.states import ProcessState
from shared.domain.timing import utcnow
from shared.errors import BadInput
from shared.store.factory import open_store

COUNT_CAP = 1000
"""The most stuck Pending and overdue orders `stats` reads; beyond it, it says `1000+`."""


async def gather_stats(settings: Settings) -> dict[str, Any]:
    """Orders per state, stuck and overdue orders, queue depths, running processes, open
    circuit breakers and the supervisor leader: one snapshot for `stats` and `watch`."""
    now = utcnow()
    store = await open_store(settings)
    try:
        by_state = await store.count_by_state()
        lease = await store.lease_get(LEASE)
        # One more than the cap, to tell "exactly the cap" from "more than the cap".
        stuck = await store.find_stuck_pending(
            due_before=now - timedelta(seconds=settings.stuck_pending_s), limit=COUNT_CAP + 1
        )
        overdue = await store.scan_expired(
            now=now - timedelta(seconds=settings.step_timeout_s),
            states=frozenset({ProcessState.PROCESSING, ProcessState.COMPENSATING}),
            limit=COUNT_CAP + 1,
        )
        components = await store.list_status(now=now)
    finally:
        await store.close()
    names = Names(settings.hub)
    queues: dict[str, int | None] = {}
    connection = await open_broker(settings, name="orderflow-stats")
    try:
        for base in names.input_queues():
            for queue in (base, names.dlq(base), names.retry(base)):
                channel = await connection.channel()
                try:
                    declared = await channel.declare_queue(queue, passive=True)
                    queues[queue] = declared.declaration_result.message_count
                except Exception:
                    queues[queue] = None  # not declared: run `orderflow init`
                finally:
                    if not channel.is_closed:
                        await channel.close()
    finally:
        await connection.close()
    leader = lease.holder if lease is not None and lease.expires_at > now else None
    breakers = sorted(
        {f"{c.name}: {op}" for c in components for op in c.data.get("open_breakers", [])}
    )
    return {
        "hub": settings.hub,
        "at": now.isoformat(),
        "by_state": {state.value: n for state, n in by_state.items()},
        "stuck_pending": [r.order_id for r in stuck[:COUNT_CAP]],
        "stuck_pending_capped": len(stuck) > COUNT_CAP,
        "overdue": [r.order_id for r in overdue.records[:COUNT_CAP]],
        "overdue_capped": len(overdue.records) > COUNT_CAP,
        "count_cap": COUNT_CAP,
        "queues": queues,
        "processes": [
            {
                "name": c.name,
                "kind": c.kind,
                "seen": human_age(c.at, now),
                "data": c.data,
            }
            for c in components
        ],
        "open_breakers": breakers,
        "leader": leader,
        "intake": intake_of(components),
    }


def intake_of(components: list[Any]) -> list[dict[str, Any]]:
    """Every consumer's intake as its process last reported it (the heartbeat's `intake`)."""
    return [
        {"process": c.name, **consumer}
        for c in components
        for consumer in c.data.get("intake") or []
        if isinstance(consumer, dict)
    ]


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
    """A process's heartbeat data as `key=value`s, leaving out what says nothing."""
    parts = []
    for key, value in data.items():
        if key in ("pid", "breakers", "agent", "intake") or value is None or value == []:
            continue
        shown = ",".join(map(str, value)) if isinstance(value, list) else value
        parts.append(f"{key}={shown}")
    return " ".join(parts)


def _orders_line(title: str, result: dict[str, Any], key: str) -> str:
    """`stuck Pending orders: 3 (e.g. …)`, or `1000+` when there were more than it read."""
    ids: list[str] = result[key]
    count = f"{result['count_cap']}+" if result[f"{key}_capped"] else str(len(ids))
    examples = f" (e.g. {', '.join(ids[:3])})" if ids else ""
    return f"{title}: {count}{examples}"


def render_stats(result: dict[str, Any]) -> Group:
    hub = result["hub"]
    states = Table(title=f"orders in hub {hub}")
    states.add_column("state")
    states.add_column("orders", justify="right")
    for state, n in result["by_state"].items():
        states.add_row(shown(state), str(n))
    queues = Table(title="queues")
    queues.add_column("queue")
    queues.add_column("messages", justify="right")
    for queue, n in result["queues"].items():
        queues.add_row(
            shown(queue.removeprefix(f"{hub}.")), "not declared" if n is None else str(n)
        )
    processes = Table(title=f"{len(result['processes'])} process(es) reporting")
    add_columns(processes, "process", "kind", "seen", "status")
    for p in result["processes"]:
        processes.add_row(
            shown(p["name"]), shown(p["kind"]), p["seen"], shown(_status_text(p["data"]))
        )
    lines = [
        f"supervisor leader: {result['leader'] or 'NONE (no supervisor holds the lease)'}",
        "open circuit breakers: " + (", ".join(result["open_breakers"]) or "none"),
        _orders_line("stuck Pending orders", result, "stuck_pending"),
        _orders_line("overdue running orders", result, "overdue"),
        _intake_line(result.get("intake", [])),
    ]
    return Group(states, queues, processes, *map(shown, lines))


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@pass_settings()
def stats(settings: Settings, as_json: bool) -> None:
    """Orders per state, stuck and overdue orders, queue depths, processes, open breakers, the
    leader. Stuck and overdue orders are counted up to 1000 (`1000+` beyond; in JSON,
    `stuck_pending_capped` / `overdue_capped`)."""
    result = asyncio.run(gather_stats(settings))
    if as_json:
        click.echo(json.dumps(result))
        return
    plain_console().print(render_stats(result))


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

    async def snapshots() -> AsyncIterator[dict[str, Any]]:
        n = 0
        while count is None or n < count:
            if n:
                await asyncio.sleep(interval)
            yield await gather_stats(settings)
            n += 1

    async def live_view() -> None:
        with Live(console=plain_console(), auto_refresh=False) as live:
            async for result in snapshots():
                live.update(render_stats(result), refresh=True)

    async def json_lines() -> None:
        async for result in snapshots():
            click.echo(json.dumps(result))
            sys.stdout.flush()  # a reader of a pipe sees each refresh as it comes

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(json_lines() if as_json else live_view())


@click.group()
def alerts() -> None:
    """Conditions an operator must act on."""


@alerts.command("list")
@click.option("--since", help="Only alerts younger than this (90s, 15m, 2h, 1d).")
@click.option("--limit", default=100, show_default=True, type=click.IntRange(1, 10_000))
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@pass_settings()
def alerts_list(settings: Settings, since: str | None, limit: int, as_json: bool) -> None:
    """Alerts, newest first."""
    try:
        after = None if since is None else utcnow() - parse_duration(since)
    except ValueError as exc:
        raise BadInput(str(exc)) from None

    async def fetch() -> list[Alert]:
        store = await open_store(settings)
        try:
            return await store.list_alerts(since=after, limit=limit)
        finally:
            await store.close()

    found = asyncio.run(fetch())
    if as_json:
        click.echo(json.dumps({"alerts": [a.model_dump(mode="json") for a in found]}))
        return
    now = utcnow()
    table = Table(title=f"{len(found)} alert(s), newest first")
    add_columns(table, "when", "kind", "severity", "order", "message")
    for a in found:
        table.add_row(
            human_age(a.at, now),
            a.kind.value,
            a.severity.value,
            shown(a.order_id or ""),
            shown(a.message[:90]),
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
            click.echo(json.dumps(alert.model_dump(mode="json")))
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
        return await follow_alerts(settings, Feed(show, refused), burst=burst, stop=stop)

    taken = asyncio.run(follow())
    if not as_json:
        click.echo(f"{taken} alert(s) taken", err=True)


async def _audit(settings: Settings, grace: float) -> dict[str, Any]:
    client = RemoteClient.open(settings.remote_url, admin_token=admin_token())
    try:
        effects = await client.ledger(account=settings.hub)  # this hub's effects only
        attempts = await client.attempts(account=settings.hub)
    finally:
        await client.close()
    store = await open_store(settings)
    try:
        report = await run_audit(
            store,
            effects,
            now=utcnow(),
            grace=timedelta(seconds=grace),
            attempts=attempts,
            undo_attempts=settings.undo_attempts,
        )
    finally:
        await store.close()
    check_dead_letters(report, await dead_letters(settings, Names(settings.hub).input_queues()))
    return report.to_json()


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
    """Check DESIGN §8's invariants against the store, the remote ledger and the dead-letter
    queues (exit 1 on any violation): 1 every order settled or recoverable; 2 one effect per
    step, every effect of a compensated order undone; 3 no write or effect by a superseded
    attempt; 4 no order's data replaced after its first submission; 5 every dead letter has a
    reason; 6 no order's remote attempts beyond its retry budget, nor an undo request's beyond
    ORDERFLOW_UNDO_ATTEMPTS. (That each process keeps running after bad input is for the fault
    suite to show.)"""
    result = asyncio.run(_audit(settings, grace))
    if as_json:
        click.echo(json.dumps(result))
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
