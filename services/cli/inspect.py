"""Operator commands that read: `stats`, `audit`."""

from __future__ import annotations

import asyncio
import json
import sys
from datetime import timedelta
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from services.cli.audit import audit as run_audit
from services.remote.client import RemoteClient
from services.supervisor.service import LEASE
from shared.bootstrap import open_broker
from shared.broker.topology import Names
from shared.config import Settings
from shared.domain.timing import utcnow
from shared.store.factory import open_store


async def gather_stats(settings: Settings) -> dict[str, Any]:
    store = await open_store(settings)
    try:
        by_state = await store.count_by_state()
        lease = await store.lease_get(LEASE)
    finally:
        await store.close()
    names = Names(settings.hub)
    queues: dict[str, int | None] = {}
    connection = await open_broker(settings, name="orderflow-stats")
    try:
        for base in names.input_queues():
            for queue in (base, names.dlq(base)):
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
    leader = lease.holder if lease is not None and lease.expires_at > utcnow() else None
    return {
        "hub": settings.hub,
        "by_state": {state.value: n for state, n in by_state.items()},
        "queues": queues,
        "leader": leader,
    }


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def stats(ctx: click.Context, as_json: bool) -> None:
    """Orders per state, queue depths, and the supervisor leader."""
    settings: Settings = ctx.find_object(Settings)  # type: ignore[assignment]
    result = asyncio.run(gather_stats(settings))
    if as_json:
        click.echo(json.dumps(result))
        return
    console = Console()
    states = Table(title=f"orders in hub {settings.hub}")
    states.add_column("state")
    states.add_column("orders", justify="right")
    for state, n in result["by_state"].items():
        states.add_row(state, str(n))
    console.print(states)
    queues = Table(title="queues")
    queues.add_column("queue")
    queues.add_column("messages", justify="right")
    for queue, n in result["queues"].items():
        queues.add_row(queue, "not declared" if n is None else str(n))
    console.print(queues)
    console.print(f"supervisor leader: {result['leader'] or 'none'}")


async def _audit(settings: Settings, grace: float) -> dict[str, Any]:
    client = RemoteClient.open(settings.remote_url)
    try:
        effects = await client.ledger()
    finally:
        await client.close()
    store = await open_store(settings)
    try:
        report = await run_audit(store, effects, now=utcnow(), grace=timedelta(seconds=grace))
    finally:
        await store.close()
    return report.to_json()


@click.command()
@click.option(
    "--grace",
    default=60.0,
    show_default=True,
    help="Seconds a live attempt may be past its deadline before it counts as lost.",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def audit(ctx: click.Context, grace: float, as_json: bool) -> None:
    """Check DESIGN §8's invariants against the store and the remote ledger (exit 1 on any)."""
    settings: Settings = ctx.find_object(Settings)  # type: ignore[assignment]
    result = asyncio.run(_audit(settings, grace))
    if as_json:
        click.echo(json.dumps(result))
    else:
        click.echo(
            f"{result['orders']} orders, {result['effects']} ledger effects; "
            + ", ".join(f"{k}: {v}" for k, v in result["by_state"].items())
        )
        for v in result["violations"]:
            click.echo(f"violation of invariant {v['invariant']}: {v['order_id']}: {v['message']}")
        click.echo(
            "audit: ok" if result["ok"] else f"audit: {len(result['violations'])} violation(s)"
        )
    if not result["ok"]:
        sys.exit(1)
