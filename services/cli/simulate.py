"""`orderflow simulate`: the whole topology in one process under virtual time, from a seed.

No server is needed: the store, the broker and the remote service are the reference adapters in
memory (harness/simulation). A seed decides the orders, the conditions and the faults, and
runs the same every time; exit 1 if any seed breaks an invariant, with its schedule printed.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict

import click

from harness.simulation.run import Outcome
from harness.simulation.seeds import Tally, outcomes
from services.cli.render import plain


@click.command("simulate")
@click.option("--seed", type=int, default=0, show_default=True, help="The (first) seed.")
@click.option(
    "--seeds",
    type=click.IntRange(min=1, max=10_000_000),
    default=1,
    show_default=True,
    help="Run this many seeds: SEED, SEED+1, …",
)
@click.option(
    "--orders",
    type=click.IntRange(min=0, max=10_000),
    default=8,
    show_default=True,
    help="Orders the shop places in each run.",
)
@click.option(
    "--faults",
    type=click.IntRange(min=0, max=1000),
    default=6,
    show_default=True,
    help="Faults of the nemesis's catalogue in each run (kills on top, as the seed says).",
)
@click.option(
    "--jobs",
    type=click.IntRange(min=1, max=256),
    default=1,
    show_default=True,
    help="Processes running seeds side by side (at most the CPU count).",
)
@click.option("--json", "as_json", is_flag=True, help="Print each run as a JSON line.")
def simulate(seed: int, seeds: int, orders: int, faults: int, jobs: int, as_json: bool) -> None:
    """Simulate SEED (or a range of seeds) and check every invariant (docs/design.md §5)."""
    jobs = min(jobs, os.cpu_count() or 1, seeds)
    tally = Tally()
    started = time.perf_counter()
    for outcome in outcomes(seed, seeds, orders=orders, faults=faults, jobs=jobs):
        tally.add(outcome)
        if as_json:
            click.echo(json.dumps(_as_json(outcome)))
        elif seeds == 1:
            _print_one(outcome)
        elif not outcome.ok:
            click.echo(plain(outcome.report(), keep_lines=True))
    tally.wall_s = time.perf_counter() - started
    if not as_json and seeds > 1:
        click.echo(tally.summary())
    if tally.violated:
        raise SystemExit(1)


def _print_one(outcome: Outcome) -> None:
    click.echo(plain(outcome.report(), keep_lines=True))
    if outcome.ok:  # the report shows the schedule only of a failed run
        click.echo(f"  conditions: {outcome.conditions.describe()}")
        for fault in outcome.schedule:
            click.echo(f"    {fault.describe()}")
    click.echo(f"  remote answers: {outcome.calls}")
    if outcome.dead_letters:
        click.echo(f"  dead letters: {outcome.dead_letters}")
    for message, count in sorted(outcome.errors.items()):
        click.echo(plain(f"  logged {count}x: {message}"))


def _as_json(outcome: Outcome) -> dict[str, object]:
    return {
        "seed": outcome.seed,
        "ok": outcome.ok,
        "orders": outcome.orders,
        "states": outcome.states,
        "violations": outcome.violations,
        "conditions": asdict(outcome.conditions),
        "schedule": [fault.describe() for fault in outcome.schedule],
        "virtual_s": round(outcome.virtual_s, 3),
        "settled_after_s": outcome.settled_after_s,
        "remote_answers": outcome.calls,
        "dead_letters": outcome.dead_letters,
        "errors": outcome.errors,
        "digest": outcome.digest,
    }
