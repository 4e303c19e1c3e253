"""`orderflow bench`: how fast orders go from publish to Processed, end to end.

Starts a whole topology with `orderflow up` in a task hub of its own (or, with `--attach`, uses
the one the settings name), publishes generated orders at a steady rate or as fast as admission
control allows, waits until every one is terminal, and reports throughput, latency percentiles
(publish to Processed, and per step), CPU seconds per order and peak memory of each process kind
(read from /proc, so the processes must run on this machine), and supervisor recoveries.
`--recovery` measures instead how long a step orphaned by a scheduler killed with SIGKILL waits
before another attempt completes it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import random
import signal
import socket
import sys
import tempfile
import time
import uuid
from collections import defaultdict
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import asyncpg
import click
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from services.cli.render import plain_console
from services.cli.settings import pass_settings
from services.cli.soak import Soak, print_soak, soak_env
from services.operator.views import all_states
from services.shop.orders import generated_order, message_id_of
from shared.bootstrap import initialise, open_broker
from shared.broker.publisher import Publisher
from shared.broker.topology import Names, delete_topology
from shared.config import Settings
from shared.domain.coordination import ComponentStatus
from shared.domain.journal import HistoryEventType
from shared.domain.messages import SubmitOrder
from shared.domain.models import StateRecord
from shared.domain.states import SETTLED_STATES, ProcessState
from shared.domain.timing import utcnow
from shared.domain.workflow import AGENTS
from shared.errors import PublishError, PublishRejected
from shared.store.factory import open_store
from shared.store.port import StateStore

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
SETTLED_POLL_S = 0.5
"""How often the bench counts the orders that settled."""
STATS_FLUSH_S = 11.0
"""A PostgreSQL backend that stays connected publishes its statistics at most once a second
while busy and 10 s after it goes idle (one that exits, at once)."""
REMOTE_KIND = "remote (stand-in)"
"""The remote service's line in the report: the stand-in for the outside service."""


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile of `values` (q in 0..100); 0 for none."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(1, min(len(ordered), math.ceil(q * len(ordered) / 100)))
    return ordered[rank - 1]


def latency_summary(values: list[float]) -> dict[str, float]:
    return {
        "p50": percentile(values, 50),
        "p95": percentile(values, 95),
        "p99": percentile(values, 99),
        "max": max(values, default=0.0),
        "mean": sum(values) / len(values) if values else 0.0,
    }


@dataclass
class ProcUsage:
    """CPU seconds and peak resident memory of one process, read from /proc."""

    cpu_s: float
    peak_rss_mib: float
    rss_mib: float


SERVERS = {"beam.smp": "rabbitmq (server)", "postgres": "postgresql (server)"}
"""Local server processes whose CPU the report shows too (by /proc comm name)."""


def servers() -> dict[int, str]:
    """Local RabbitMQ and PostgreSQL processes (none when they run elsewhere)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            comm = (entry / "comm").read_text().strip()
        except OSError:
            continue
        if comm in SERVERS:
            found[int(entry.name)] = SERVERS[comm]
    return found


@dataclass(frozen=True)
class MachineUsage:
    """The whole machine since boot, from /proc/stat."""

    busy_s: float
    total_s: float
    context_switches: int

    def __sub__(self, other: MachineUsage) -> MachineUsage:
        return MachineUsage(
            self.busy_s - other.busy_s,
            self.total_s - other.total_s,
            self.context_switches - other.context_switches,
        )


def machine_usage() -> MachineUsage:
    try:
        lines = Path("/proc/stat").read_text().splitlines()
        fields = [int(f) for f in lines[0].split()[1:]]
        switches = next((int(line.split()[1]) for line in lines if line.startswith("ctxt ")), 0)
    except (OSError, ValueError, IndexError):
        return MachineUsage(0.0, 0.0, 0)
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    total = sum(fields[:8])  # user nice system idle iowait irq softirq steal
    return MachineUsage((total - idle) / CLOCK_TICKS, total / CLOCK_TICKS, switches)


async def store_transactions(url: str) -> int | None:
    """Transactions the store's PostgreSQL database has run so far (every statement the store
    sends outside an explicit transaction is one); None for another store, or when the count
    cannot be read."""
    if not url.startswith(("postgresql://", "postgres://")):
        return None
    try:
        connection = await asyncpg.connect(url, timeout=5)
    except (OSError, asyncpg.PostgresError, TimeoutError):
        return None
    try:
        # The server publishes its counters at most once a second: ask for a fresh snapshot.
        await connection.execute("SELECT pg_stat_clear_snapshot()")
        count = await connection.fetchval(
            "SELECT xact_commit + xact_rollback FROM pg_stat_database "
            "WHERE datname = current_database()"
        )
        return int(count) if count is not None else None
    finally:
        await connection.close()


def children(pid: int) -> dict[int, str]:
    """The child processes of `pid` and their command lines (empty where /proc cannot tell)."""
    try:
        pids = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return {}
    found = {}
    for child in map(int, pids):
        try:
            found[child] = Path(f"/proc/{child}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
    return found


def proc_usage(pid: int) -> ProcUsage | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime, stime
    kib = {
        line.split(":")[0]: int(line.split()[1])
        for line in status.splitlines()
        if line.startswith(("VmHWM", "VmRSS"))
    }
    return ProcUsage(cpu, kib.get("VmHWM", 0) / 1024, kib.get("VmRSS", 0) / 1024)


@dataclass
class Run:
    settings: Settings
    orders: int
    rate: float
    config: dict[str, Any]
    publish_at: dict[str, datetime] = field(default_factory=dict)
    started: float = 0.0
    finished: float = 0.0


# -- the topology --------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@asynccontextmanager
async def topology(
    settings: Settings, *, schedulers: int, agents: int, env: dict[str, str], workdir: Path
) -> AsyncIterator[asyncio.subprocess.Process]:
    """`orderflow up` in the background, its output in `workdir/up.log`; stopped on exit."""
    log = (workdir / "up.log").open("wb")
    up = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "services.cli",
        "up",
        "--schedulers",
        str(schedulers),
        "--agents",
        str(agents),
        stdout=log,
        stderr=asyncio.subprocess.STDOUT,
        env=os.environ | env,
    )
    try:
        yield up
    finally:
        if up.returncode is None:
            up.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(up.wait(), timeout=settings.drain_timeout_s + 15)
            except TimeoutError:
                up.kill()
                await up.wait()
        log.close()


async def wait_ready(
    store: StateStore, expected: int, up: asyncio.subprocess.Process | None, timeout: float
) -> list[ComponentStatus]:
    """Until `expected` processes report their heartbeats."""
    give_up = time.monotonic() + timeout
    while time.monotonic() < give_up:
        if up is not None and up.returncode is not None:
            raise click.ClickException(f"`orderflow up` exited with code {up.returncode}")
        statuses = await store.list_status(now=utcnow())
        if len(statuses) >= expected:
            return statuses
        await asyncio.sleep(0.25)
    raise click.ClickException(f"fewer than {expected} processes reported within {timeout:.0f}s")


# -- publishing and waiting ----------------------------------------------------------------------


async def publish(settings: Settings, run: Run, *, seed: int, concurrency: int = 200) -> None:
    """Publish `run.orders` generated orders at `run.rate` per second (0: as fast as the
    broker and admission control take them; a refused publish is retried after a pause)."""
    rng = random.Random(seed)
    orders = [generated_order(rng) for _ in range(run.orders)]
    names = Names(settings.hub)
    connection = await open_broker(settings, name="orderflow-bench")
    gate = asyncio.Semaphore(concurrency)
    loop = asyncio.get_running_loop()
    start = loop.time()
    try:
        publisher = await Publisher.open(connection, timeout=settings.publish_timeout_s)

        async def one(i: int) -> None:
            order = orders[i]
            if run.rate:
                delay = start + i / run.rate - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
            async with gate:
                while True:
                    run.publish_at[order.order_id] = utcnow()
                    try:
                        await publisher.publish(
                            SubmitOrder(order=order),
                            exchange=names.submit,
                            routing_key=names.orders,
                            message_id=message_id_of(order),
                            correlation_id=order.order_id,
                        )
                        return
                    except PublishRejected:
                        await asyncio.sleep(0.2)  # the orders queue is full: admission control
                    except PublishError:
                        # No confirm in time (a loaded broker) or a lost connection: the same
                        # message id again, which the inbox drops if the first copy arrived.
                        await asyncio.sleep(1.0)

        await asyncio.gather(*(one(i) for i in range(run.orders)))
        await publisher.close()
    finally:
        await connection.close()


async def wait_settled(
    store: StateStore,
    run: Run,
    timeout: float,
    progress: bool,
    publishing: asyncio.Task[None] | None = None,
) -> int:
    """Until every order is terminal; the number that are. A publisher that failed ends the
    wait with its error (its orders would never come)."""
    bar = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=plain_console(stderr=True),
        transient=True,
        disable=not progress,
    )
    give_up = time.monotonic() + timeout
    with bar:
        task = bar.add_task("orders terminal", total=run.orders)
        while True:
            counts = await store.count_by_state()
            done = sum(counts[s] for s in SETTLED_STATES)
            bar.update(task, completed=done)
            if done >= run.orders or time.monotonic() > give_up:
                return done
            raise_if_failed(publishing)
            # Each look counts the hub's whole state table: every 0.1 s it was a tenth of the
            # database's CPU in a long run. The figures come from the records, not from this.
            await asyncio.sleep(SETTLED_POLL_S)


def raise_if_failed(task: asyncio.Task[None] | None) -> None:
    if task is not None and task.done() and task.exception() is not None:
        task.result()


# -- the report ----------------------------------------------------------------------------------


def run_seconds(run: Run, mine: list[StateRecord]) -> float:
    """From the first order's publish to the last one's settling, read from the records, so
    that how often the bench looks does not change the figure; the bench's own clock for a
    run that did not settle."""
    settled = [s.updated_at for s in mine if s.process_state in SETTLED_STATES]
    if run.publish_at and settled and len(settled) == run.orders:
        return (max(settled) - min(run.publish_at.values())).total_seconds()
    return run.finished - run.started


def report(
    run: Run,
    states: list[StateRecord],
    before: dict[int, ProcUsage],
    after: dict[int, ProcUsage],
    kinds: dict[int, str],
) -> dict[str, Any]:
    mine = [s for s in states if s.order_id in run.publish_at]
    wall = run_seconds(run, mine)
    by_state: dict[str, int] = defaultdict(int)
    for s in mine:
        by_state[s.process_state.value] += 1
    latencies = [
        (s.updated_at - run.publish_at[s.order_id]).total_seconds()
        for s in mine
        if s.process_state is ProcessState.PROCESSED
    ]
    steps: dict[str, list[float]] = defaultdict(list)
    for s in mine:
        for name, step in s.steps.items():
            if step.completed_at is not None and step.started_at is not None:
                steps[name].append((step.completed_at - step.started_at).total_seconds())
    per_kind: dict[str, dict[str, float]] = defaultdict(
        lambda: {"processes": 0, "cpu_s": 0.0, "peak_rss_mib": 0.0}
    )
    for pid, kind in kinds.items():
        if pid not in after:
            continue
        used = after[pid].cpu_s - (before[pid].cpu_s if pid in before else 0.0)
        entry = per_kind[kind]
        entry["processes"] += 1
        entry["cpu_s"] += used
        entry["peak_rss_mib"] = max(entry["peak_rss_mib"], after[pid].peak_rss_mib)
    n = max(1, len(mine))
    return {
        "orders": run.orders,
        "terminal": sum(by_state.values()),
        "by_state": dict(by_state),
        "wall_s": round(wall, 3),
        "orders_per_s": round(len(mine) / wall, 1) if wall else 0.0,
        "latency_s": {k: round(v, 4) for k, v in latency_summary(latencies).items()},
        "step_latency_s": {
            name: {k: round(v, 4) for k, v in latency_summary(values).items()}
            for name, values in sorted(steps.items())
        },
        "processes": {
            kind: {
                "processes": int(e["processes"]),
                "cpu_ms_per_order": round(1000 * e["cpu_s"] / n, 3),
                "cpu_s": round(e["cpu_s"], 2),
                "peak_rss_mib": round(e["peak_rss_mib"], 1),
            }
            for kind, e in sorted(per_kind.items())
        },
        "recoveries": sum(max(0, s.attempt - 1) for s in mine),
        "settings": run.config,
    }


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


# -- the command ---------------------------------------------------------------------------------


@click.command()
@click.option("--orders", "count", default=1000, show_default=True, type=click.IntRange(min=1))
@click.option(
    "--rate",
    default=0.0,
    show_default=True,
    type=click.FloatRange(min=0),
    help="Orders per second offered; 0: as fast as admission control allows.",
)
@click.option("--attach", is_flag=True, help="Use the running topology of the settings' hub.")
@click.option("--schedulers", default=1, show_default=True, type=click.IntRange(min=1))
@click.option("--agents", default=1, show_default=True, type=click.IntRange(min=1))
@click.option("--transient-error-rate", default=0.0, type=click.FloatRange(0, 1))
@click.option("--remote-latency-ms", default=0.0, type=click.FloatRange(min=0))
@click.option("--store-url", help="The store to benchmark (default: ORDERFLOW_STORE_URL).")
@click.option("--recovery", is_flag=True, help="Measure recovery after kill -9 of a scheduler.")
@click.option(
    "--soak",
    is_flag=True,
    help="Short retention settings, purges during the run; report every table's and queue's size.",
)
@click.option("--seed", default=1, show_default=True)
@click.option("--timeout", default=600.0, show_default=True, help="Seconds to wait for the run.")
@click.option("--keep", is_flag=True, help="Keep the benchmark's task hub (default: drop it).")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@pass_settings("store_url")
def bench(
    base: Settings,
    count: int,
    rate: float,
    attach: bool,
    schedulers: int,
    agents: int,
    transient_error_rate: float,
    remote_latency_ms: float,
    recovery: bool,
    soak: bool,
    seed: int,
    timeout: float,
    keep: bool,
    as_json: bool,
) -> None:
    """Measure end-to-end throughput and latency (or, with --recovery, recovery time)."""
    changes: dict[str, Any] = {}
    if not attach:
        changes["hub"] = f"bench{uuid.uuid4().hex[:8]}"
        changes["remote_url"] = f"http://127.0.0.1:{_free_port()}"
    settings = base.model_copy(update=changes)
    if (recovery or soak) and attach:
        raise click.UsageError("--recovery and --soak start their own topology; drop --attach")
    if recovery and soak:
        raise click.UsageError("--recovery and --soak are two different runs")
    if recovery:
        schedulers = max(2, schedulers)
    config = {
        "hub": settings.hub,
        "store": settings.store_url.split("://")[0],
        "schedulers": schedulers if not attach else "attached",
        "agents_per_step": agents if not attach else "attached",
        "transient_error_rate": transient_error_rate,
        "remote_latency_ms": remote_latency_ms,
        "rate": rate or "max",
        "orders": count,
    }
    if soak:
        config["soak"] = True
    run = Run(settings, count, rate, config)
    coro = (
        _recovery(settings, run, seed=seed, timeout=timeout, keep=keep)
        if recovery
        else _bench(
            settings,
            run,
            attach=attach,
            schedulers=schedulers,
            agents=agents,
            faults={
                "ORDERFLOW_REMOTE_TRANSIENT_ERROR_RATE": str(transient_error_rate),
                "ORDERFLOW_REMOTE_LATENCY_MS": str(remote_latency_ms),
            },
            seed=seed,
            timeout=timeout,
            keep=keep,
            progress=not as_json and sys.stderr.isatty(),
            soak=soak,
        )
    )
    result = asyncio.run(coro)
    if as_json:
        click.echo(json.dumps(result))
    elif recovery:
        _print_recovery(result)
    else:
        print_report(result)
        if "soak" in result:
            print_soak(result)


def _env(settings: Settings, faults: dict[str, str], workdir: Path) -> dict[str, str]:
    return {
        "ORDERFLOW_HUB": settings.hub,
        "ORDERFLOW_STORE_URL": settings.store_url,
        "ORDERFLOW_RABBITMQ_URL": settings.rabbitmq_url,
        "ORDERFLOW_REMOTE_URL": settings.remote_url,
        "ORDERFLOW_REMOTE_LEDGER_PATH": str(workdir / "ledger.sqlite3"),
        "ORDERFLOW_LOG_LEVEL": os.environ.get("ORDERFLOW_LOG_LEVEL", "WARNING"),
        **faults,
    }


async def _cleanup(settings: Settings, store: StateStore, keep: bool) -> None:
    if keep:
        return
    with contextlib.suppress(Exception):
        await store.drop()
    with contextlib.suppress(Exception):
        connection = await open_broker(settings, name="orderflow-bench-cleanup")
        try:
            await delete_topology(await connection.channel(), Names(settings.hub))
        finally:
            await connection.close()


async def _bench(
    settings: Settings,
    run: Run,
    *,
    attach: bool,
    schedulers: int,
    agents: int,
    faults: dict[str, str],
    seed: int,
    timeout: float,
    keep: bool,
    progress: bool,
    soak: bool = False,
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="orderflow-bench-") as tmp:
        workdir = Path(tmp)
        store = await open_store(settings)
        try:
            if attach:
                statuses = await wait_ready(store, 1, None, timeout=10)
                counted = await store_transactions(settings.store_url)
                result = await _measure(store, run, statuses, seed, timeout, progress)
                if counted is not None:
                    # Processes that stay up publish their counts up to 10 s late (when idle).
                    await asyncio.sleep(STATS_FLUSH_S)
                return await with_transactions(result, counted, settings.store_url)
            expected = 2 + schedulers + agents * len(AGENTS)
            await initialise(settings)
            env = _env(settings, faults, workdir) | (soak_env() if soak else {})
            async with topology(
                settings, schedulers=schedulers, agents=agents, env=env, workdir=workdir
            ) as up:
                statuses = await wait_ready(store, expected, up, timeout=60)
                # The remote service has no heartbeat; it is a stand-in for the outside world,
                # but its CPU is this machine's too, so it is reported on a line of its own.
                remote = {
                    pid: REMOTE_KIND
                    for pid, cmdline in children(up.pid).items()
                    if "serve remote" in cmdline
                }
                counted = await store_transactions(settings.store_url)
                soaking = Soak(settings, store) if soak else None
                try:
                    result = await _measure(
                        store, run, statuses, seed, timeout, progress, remote, soaking
                    )
                except click.ClickException:
                    raise
                except Exception as exc:
                    tail = (workdir / "up.log").read_text(errors="replace")[-2000:]
                    raise click.ClickException(f"{exc!r}; the topology said:\n{tail}") from exc
            # Stopped: every backend of the topology published its counts as it exited.
            return await with_transactions(result, counted, settings.store_url)
        finally:
            await _cleanup(settings, store, keep)
            await store.close()


async def _measure(
    store: StateStore,
    run: Run,
    statuses: list[ComponentStatus],
    seed: int,
    timeout: float,
    progress: bool,
    others: dict[int, str] | None = None,
    soak: Soak | None = None,
) -> dict[str, Any]:
    kinds = {int(s.data["pid"]): s.kind for s in statuses if "pid" in s.data} | (others or {})
    kinds |= servers()
    before = {pid: u for pid in kinds if (u := proc_usage(pid)) is not None}
    machine_before = machine_usage()
    run.started = time.monotonic()
    publishing = asyncio.create_task(publish(run.settings, run, seed=seed))
    if soak is None:
        terminal = await wait_settled(store, run, timeout, progress, publishing)
    else:
        terminal = await soak.wait(run.orders, timeout, progress, publishing)
    run.finished = time.monotonic()
    await publishing
    machine = machine_usage() - machine_before
    kinds |= servers()  # server processes started meanwhile (new connections' backends)
    after = {pid: u for pid in kinds if (u := proc_usage(pid)) is not None}
    result = report(run, await all_states(store), before, after, kinds)
    result["terminal"] = terminal
    result["machine"] = machine_report(machine, result["processes"], result["orders"])
    if soak is not None:
        # Most orders were purged before the end: the figure is the bench's own clock, and
        # the latencies are those of the orders still stored.
        wall = run.finished - run.started
        result["wall_s"] = round(wall, 3)
        result["orders_per_s"] = round(terminal / wall, 1) if wall else 0.0
        result["soak"] = await soak.result()
    return result


async def with_transactions(
    result: dict[str, Any], before: int | None, store_url: str
) -> dict[str, Any]:
    """Add the store transactions per order since `before` (PostgreSQL only)."""
    if before is not None and (after := await store_transactions(store_url)) is not None:
        result["store_transactions_per_order"] = round(
            (after - before) / max(1, result["orders"]), 2
        )
    return result


def machine_report(
    used: MachineUsage, processes: dict[str, dict[str, Any]], orders: int
) -> dict[str, Any]:
    """The whole machine over the run: how saturated it was, how much of its CPU the processes
    listed do not account for (this bench itself, exited backends, everything else), and how
    often it switched between processes."""
    listed = sum(p["cpu_s"] for p in processes.values())
    n = max(1, orders)
    return {
        "cores": os.cpu_count() or 1,
        "busy_cpu_s": round(used.busy_s, 2),
        "utilisation": round(used.busy_s / used.total_s, 3) if used.total_s else 0.0,
        "cpu_ms_per_order": round(1000 * used.busy_s / n, 3),
        "unlisted_cpu_s": round(max(0.0, used.busy_s - listed), 2),
        "context_switches_per_order": round(used.context_switches / n, 1),
    }


# -- recovery ------------------------------------------------------------------------------------


async def _recovery(
    settings: Settings, run: Run, *, seed: int, timeout: float, keep: bool
) -> dict[str, Any]:
    """kill -9 one of two schedulers while it has steps in flight; time until another attempt
    completes one of its orphaned steps."""
    faults = {"ORDERFLOW_REMOTE_LATENCY_MS": "100"}  # so that steps are in flight when it dies
    with tempfile.TemporaryDirectory(prefix="orderflow-bench-") as tmp:
        workdir = Path(tmp)
        store = await open_store(settings)
        try:
            await initialise(settings)
            env = _env(settings, faults, workdir)
            async with topology(settings, schedulers=2, agents=1, env=env, workdir=workdir) as up:
                statuses = await wait_ready(store, 2 + 2 + len(AGENTS), up, timeout=60)
                victim = next(s for s in statuses if s.kind == "scheduler")
                run.rate = run.rate or 50.0
                publishing = asyncio.create_task(publish(settings, run, seed=seed))
                orphans = await _in_flight(store, victim.name, timeout=30)
                os.kill(int(victim.data["pid"]), signal.SIGKILL)
                killed = time.monotonic()
                first = await _first_completion(store, orphans, timeout=timeout)
                recovered_s = time.monotonic() - killed
                run.started = killed
                await wait_settled(store, run, timeout, progress=False)
                await publishing
        finally:
            await _cleanup(settings, store, keep)
            await store.close()
    bound = settings.step_timeout_s + settings.supervisor_interval_s + 1
    return {
        "killed": victim.name,
        "orphaned_orders": len(orphans),
        "first_recovered_order": first,
        "kill_to_first_completion_s": round(recovered_s, 3),
        "bound_s": bound,
        "within_bound": recovered_s <= bound,
        "step_timeout_s": settings.step_timeout_s,
        "supervisor_interval_s": settings.supervisor_interval_s,
    }


async def _in_flight(store: StateStore, owner: str, *, timeout: float) -> dict[str, int]:
    """Orders the scheduler `owner` is running (id -> attempt), once it has a few."""
    give_up = time.monotonic() + timeout
    while time.monotonic() < give_up:
        running = {
            s.order_id: s.attempt
            for s in await all_states(store)
            if s.process_state is ProcessState.PROCESSING
            and s.owner == owner
            and s.locked_by is not None
        }
        if len(running) >= 5:
            return running
        await asyncio.sleep(0.05)
    raise click.ClickException(f"{owner} never had steps in flight")


async def _first_completion(store: StateStore, orphans: dict[str, int], *, timeout: float) -> str:
    """The first orphan a later attempt completed a step of."""
    give_up = time.monotonic() + timeout
    while time.monotonic() < give_up:
        for order_id, attempt in orphans.items():
            events = await store.read_history(order_id)
            if any(
                e.type is HistoryEventType.STEP_COMPLETED and (e.attempt or 0) > attempt
                for e in events
            ):
                return order_id
        await asyncio.sleep(0.05)
    raise click.ClickException("no orphaned order was completed by another attempt")


def _print_recovery(result: dict[str, Any]) -> None:
    verdict = "within" if result["within_bound"] else "OVER"
    click.echo(
        f"killed {result['killed']} with {result['orphaned_orders']} orders in flight; "
        f"first orphan completed by another attempt after "
        f"{result['kill_to_first_completion_s']:.2f}s ({verdict} the bound of "
        f"{result['bound_s']:.1f}s = step timeout {result['step_timeout_s']:g}s + supervisor "
        f"interval {result['supervisor_interval_s']:g}s + 1s)"
    )
