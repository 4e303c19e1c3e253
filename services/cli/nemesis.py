"""`orderflow nemesis`: a seeded, randomized schedule of faults over a real run, then the audit.

It starts a PostgreSQL cluster and a RabbitMQ node of its own (never the machine's), the whole
topology on them, submits orders to a remote service with transient errors, declines and hangs,
strikes the seed's faults, waits for every order to settle and checks DESIGN §8. The same seed
gives the same schedule; exit 1 on any violation, so a failing seed is a test case.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import click

from harness.nemesis.run import run_seeds
from services.cli.render import plain


@click.command("nemesis")
@click.option("--seed", type=int, required=True, help="Seed of the fault schedule.")
@click.option(
    "--faults",
    type=click.IntRange(min=0, max=200),
    default=9,
    show_default=True,
    help="Faults to strike (nine or more try every kind).",
)
@click.option(
    "--orders",
    type=click.IntRange(min=1, max=100_000),
    default=40,
    show_default=True,
    help="Orders to submit across the faults.",
)
@click.option(
    "--keep",
    type=click.Path(file_okay=False, path_type=Path),
    help="Keep the processes' logs and the remote ledger in this directory.",
)
@click.option(
    "--runs",
    type=click.IntRange(min=1, max=10_000),
    default=1,
    show_default=True,
    help="Run seeds SEED, SEED+1, … this many, one after the other on the same servers.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON (a line a run).")
def nemesis(
    seed: int, faults: int, orders: int, keep: Path | None, runs: int, as_json: bool
) -> None:
    """Faults drawn by SEED over a run on private servers, then the audit."""

    async def each() -> bool:
        ok = True
        async for figures in run_seeds(seed, runs, faults, orders, keep=keep):
            data = figures.as_dict()
            if as_json:
                click.echo(json.dumps(data))
            else:
                _print(data)
            ok = ok and figures.ok
        return ok

    if not asyncio.run(each()):
        raise SystemExit(1)


def _print(data: dict[str, Any]) -> None:
    click.echo(f"seed {data['seed']}: {data['faults']} faults, {data['orders']} orders")
    for fault in data["schedule"]:
        click.echo(f"  {fault['text']}")
    settle = data["settle_s"]
    click.echo(
        f"submitted {data['submitted']}; lost {data['lost']}; duplicate effects "
        f"{data['duplicate_effects']}; budget overspends {data['budget_overspends']}; audit "
        f"violations {data['audit_violations']}; "
        + (f"settled {settle} s after the last fault" if settle is not None else "NOT SETTLED")
    )
    click.echo("outcome: " + ", ".join(f"{n} {state}" for state, n in data["outcome"].items()))
    for line in [*data["violations"], *data["unapplied"], *data["notes"]]:
        click.echo(plain(f"  {line}"))
    click.echo(
        f"{'ok' if data['ok'] else 'FAILED'} in {data['total_s']} s (logs: {data['workdir']})"
    )
