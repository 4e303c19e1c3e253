"""`orderflow bench`: how fast orders go from publish to Processed, end to end (or, with
`--recovery`, how long an orphaned step waits). The run itself is `harness/bench/`; this module
parses the options, shows the progress on a terminal and prints the report.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

import click
from rich.table import Table

from harness.bench.recovery import run_recovery
from harness.bench.run import Plan, new_run, run_bench
from services.cli.render import plain_console, progress_bar
from services.cli.settings import pass_settings
from shared.config import Settings
from shared.errors import BenchFailed


@click.command()
@click.option(
    "--orders",
    default=1000,
    show_default=True,
    type=click.IntRange(min=1),
    help="Orders to publish (generated).",
)
@click.option(
    "--rate",
    default=0.0,
    show_default=True,
    type=click.FloatRange(min=0),
    help="Orders per second offered; 0: as fast as admission control allows.",
)
@click.option("--attach", is_flag=True, help="Use the running topology of the settings' hub.")
@click.option(
    "--schedulers",
    default=1,
    show_default=True,
    type=click.IntRange(min=1),
    help="Scheduler processes the run starts.",
)
@click.option(
    "--agents",
    default=1,
    show_default=True,
    type=click.IntRange(min=1),
    help="Processes per agent kind.",
)
@click.option(
    "--transient-error-rate",
    default=0.0,
    show_default=True,
    type=click.FloatRange(0, 1),
    help="Share of the remote service's calls answered 503 "
    "(its ORDERFLOW_REMOTE_TRANSIENT_ERROR_RATE).",
)
@click.option(
    "--remote-latency-ms",
    default=0.0,
    show_default=True,
    type=click.FloatRange(min=0),
    help="Milliseconds the remote service adds to every call (its ORDERFLOW_REMOTE_LATENCY_MS).",
)
@click.option("--store-url", help="The store to benchmark (default: ORDERFLOW_STORE_URL).")
@click.option("--recovery", is_flag=True, help="Measure recovery after kill -9 of a scheduler.")
@click.option(
    "--soak",
    is_flag=True,
    help="Short retention settings, purges during the run; report every table's and queue's size.",
)
@click.option(
    "--seed",
    default=1,
    show_default=True,
    help="Seed of the generated orders, for repeatable runs.",
)
@click.option("--timeout", default=600.0, show_default=True, help="Seconds to wait for the run.")
@click.option("--keep", is_flag=True, help="Keep the benchmark's task hub (default: drop it).")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@pass_settings("store_url")
def bench(settings: Settings, /, as_json: bool, **options: Any) -> None:
    """Measure end-to-end throughput and latency (or, with --recovery, recovery time)."""
    plan = Plan(**options)
    if (plan.recovery or plan.soak) and plan.attach:
        raise click.UsageError("--recovery and --soak start their own topology; drop --attach")
    if plan.recovery and plan.soak:
        raise click.UsageError("--recovery and --soak are two different runs")
    run = new_run(settings, plan)
    try:
        if plan.recovery:
            result = asyncio.run(run_recovery(run, plan))
        else:
            shown = not as_json and sys.stderr.isatty()
            with progress_bar(shown=shown, transient=True) as progress:
                result = asyncio.run(run_bench(run, plan, progress))
    except BenchFailed as exc:
        raise click.ClickException(str(exc)) from exc
    if as_json:
        click.echo(json.dumps(result))
    elif plan.recovery:
        _print_recovery(result)
    else:
        print_report(result)
        if "soak" in result:
            print_soak(result)


def print_report(result: dict[str, Any]) -> None:
    console = plain_console()
    lat = result["latency_s"]
    console.print(
        f"{result['terminal']}/{result['orders']} orders terminal in {result['wall_s']}s: "
        f"{result['orders_per_s']} orders/s; "
        + ", ".join(f"{n} {s}" for s, n in sorted(result["by_state"].items()))
    )
    table = Table(title="latency (s)")
    for column in ("", "p50", "p95", "p99", "max"):
        table.add_column(column, justify="right")
    table.add_row("publish → Processed", *(f"{lat[k]:.3f}" for k in ("p50", "p95", "p99", "max")))
    for name, s in result["step_latency_s"].items():
        table.add_row(f"step {name}", *(f"{s[k]:.3f}" for k in ("p50", "p95", "p99", "max")))
    console.print(table)
    procs = Table(title="processes")
    for column in ("kind", "processes", "CPU ms/order", "CPU s", "peak RSS MiB"):
        procs.add_column(column, justify="right")
    for kind, p in result["processes"].items():
        procs.add_row(
            kind,
            str(p["processes"]),
            f"{p['cpu_ms_per_order']:.2f}",
            f"{p['cpu_s']:.1f}",
            f"{p['peak_rss_mib']:.0f}",
        )
    console.print(procs)
    machine = result.get("machine")
    if machine:
        console.print(
            f"machine: {machine['cores']} cores {100 * machine['utilisation']:.0f}% busy, "
            f"{machine['cpu_ms_per_order']:.2f} CPU ms/order in all "
            f"({machine['unlisted_cpu_s']:.1f} CPU s not in the table), "
            f"{machine['context_switches_per_order']:.0f} context switches/order"
        )
    if "store_transactions_per_order" in result:
        console.print(f"store transactions per order: {result['store_transactions_per_order']}")
    console.print(f"supervisor recoveries: {result['recoveries']}")
    console.print("settings: " + ", ".join(f"{k}={v}" for k, v in result["settings"].items()))


def print_soak(result: dict[str, Any]) -> None:
    console = plain_console()
    soak = result["soak"]
    rows = Table(title="tables at the end (rows)")
    for column in ("table", "rows", "peak"):
        rows.add_column(column, justify="right")
    for name, n in sorted(soak["rows"].items()):
        rows.add_row(name, str(n), str(soak["rows_peak"].get(name, n)))
    console.print(rows)
    queues = Table(title="durable queues at the end (messages ready)")
    for column in ("queue", "messages", "peak"):
        queues.add_column(column, justify="right")
    for name, n in sorted(soak["queues"].items()):
        queues.add_row(name, str(n), str(soak["queues_peak"].get(name, n)))
    console.print(queues)
    retention = soak["retention"]
    purges = Table(title="retention (supervisor heartbeats)")
    for column in ("purge", "passes", "batches"):
        purges.add_column(column, justify="right")
    for name in sorted(retention["passes"]):
        purges.add_row(name, str(retention["passes"][name]), str(retention["batches"].get(name, 0)))
    console.print(purges)
    deleted = ", ".join(f"{n} {kind}" for kind, n in sorted(retention["deleted"].items()))
    console.print(f"deleted: {deleted or 'nothing'}; sizes sampled {soak['samples']} times")
    console.print(
        "retention: " + ", ".join(f"{k}={v}" for k, v in soak["retention_settings"].items())
    )


def _print_recovery(result: dict[str, Any]) -> None:
    verdict = "within" if result["within_bound"] else "OVER"
    click.echo(
        f"killed {result['killed']} with {result['orphaned_orders']} orders in flight; "
        f"first orphan completed by another attempt after "
        f"{result['kill_to_first_completion_s']:.2f}s ({verdict} the bound of "
        f"{result['bound_s']:.1f}s = step timeout {result['step_timeout_s']:g}s + supervisor "
        f"interval {result['supervisor_interval_s']:g}s + 1s)"
    )
