"""One benchmark run: the topology started (or attached to), the load offered, the figures read."""

from __future__ import annotations

import asyncio
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.bench.database import STATS_FLUSH_S, store_transactions, with_transactions
from harness.bench.load import Progress, Run, publish, wait_settled
from harness.bench.procfs import machine_usage, servers, usages
from harness.bench.report import machine_report, report
from harness.bench.soak import Soak, soak_env
from harness.bench.topology import (
    cleanup,
    last_words,
    private_settings,
    processes,
    remote_processes,
    topology,
    topology_env,
    wait_ready,
)
from services.operator.views import all_states
from shared.bootstrap import connect_store, initialise
from shared.config import Settings
from shared.domain.coordination import ComponentStatus
from shared.errors import BenchFailed
from shared.store.port import StateStore


@dataclass(frozen=True)
class Plan:
    """What the operator asked of a run."""

    orders: int
    rate: float = 0.0
    """Orders per second offered; 0: as fast as admission control allows."""
    attach: bool = False
    """Measure the running topology of the settings' hub instead of starting one."""
    schedulers: int = 1
    agents: int = 1
    """Processes per agent kind."""
    transient_error_rate: float = 0.0
    remote_latency_ms: float = 0.0
    seed: int = 1
    timeout: float = 600.0
    keep: bool = False
    """Keep the run's task hub (else it is dropped afterwards)."""
    soak: bool = False
    recovery: bool = False

    @property
    def faults(self) -> dict[str, str]:
        """The remote service's faults, as its settings."""
        return {
            "ORDERFLOW_REMOTE_TRANSIENT_ERROR_RATE": str(self.transient_error_rate),
            "ORDERFLOW_REMOTE_LATENCY_MS": str(self.remote_latency_ms),
        }


def new_run(settings: Settings, plan: Plan) -> Run:
    """The run the plan asks for: in a task hub of its own unless attached."""
    run_settings = settings if plan.attach else private_settings(settings)
    schedulers = max(2, plan.schedulers) if plan.recovery else plan.schedulers
    config: dict[str, Any] = {
        "hub": run_settings.hub,
        "store": run_settings.store.store_url.split("://")[0],
        "schedulers": schedulers if not plan.attach else "attached",
        "agents_per_step": plan.agents if not plan.attach else "attached",
        "transient_error_rate": plan.transient_error_rate,
        "remote_latency_ms": plan.remote_latency_ms,
        "rate": plan.rate or "max",
        "orders": plan.orders,
    }
    if plan.soak:
        config["soak"] = True
    return Run(run_settings, plan.orders, plan.rate, config)


async def run_bench(run: Run, plan: Plan, progress: Progress | None = None) -> dict[str, Any]:
    """The figures of the run, its hub dropped afterwards unless `plan.keep`."""
    with tempfile.TemporaryDirectory(prefix="orderflow-bench-") as tmp:
        store = await connect_store(run.settings)
        try:
            if plan.attach:
                return await _attached(store, run, plan, progress)
            return await _started(store, run, plan, progress, Path(tmp))
        finally:
            await cleanup(run.settings, store, plan.keep)
            await store.close()


async def _attached(
    store: StateStore, run: Run, plan: Plan, progress: Progress | None
) -> dict[str, Any]:
    statuses = await wait_ready(store, 1, None, timeout=10)
    counted = await store_transactions(run.settings.store.store_url)
    result = await measure(store, run, statuses, plan, progress)
    if counted is not None:
        # Processes that stay up publish their counts up to 10 s late (when idle).
        await asyncio.sleep(STATS_FLUSH_S)
    return await with_transactions(result, counted, run.settings.store.store_url)


async def _started(
    store: StateStore, run: Run, plan: Plan, progress: Progress | None, workdir: Path
) -> dict[str, Any]:
    settings = run.settings
    await initialise(settings)
    env = topology_env(settings, plan.faults, workdir) | (soak_env() if plan.soak else {})
    async with topology(
        settings, schedulers=plan.schedulers, agents=plan.agents, env=env, workdir=workdir
    ) as up:
        expected = processes(plan.schedulers, plan.agents)
        statuses = await wait_ready(store, expected, up, timeout=60)
        remote = remote_processes(up)
        counted = await store_transactions(settings.store.store_url)
        soaking = Soak(settings, store) if plan.soak else None
        try:
            result = await measure(store, run, statuses, plan, progress, remote, soaking)
        except BenchFailed:
            raise
        except Exception as exc:
            raise BenchFailed(f"{exc!r}; the topology said:\n{last_words(workdir)}") from exc
    # Stopped: every backend of the topology published its counts as it exited.
    return await with_transactions(result, counted, settings.store.store_url)


async def measure(
    store: StateStore,
    run: Run,
    statuses: list[ComponentStatus],
    plan: Plan,
    progress: Progress | None,
    others: dict[int, str] | None = None,
    soak: Soak | None = None,
) -> dict[str, Any]:
    """Offer the load and wait for it to settle, reading /proc before and after."""
    kinds = {int(s.data["pid"]): s.kind for s in statuses if "pid" in s.data} | (others or {})
    kinds |= servers()
    before = usages(kinds)
    machine_before = machine_usage()
    run.started = time.monotonic()
    publishing = asyncio.create_task(publish(run.settings, run, seed=plan.seed))
    if soak is None:
        terminal = await wait_settled(store, run, plan.timeout, progress, publishing)
    else:
        terminal = await soak.wait(run.orders, plan.timeout, progress, publishing)
    run.finished = time.monotonic()
    await publishing
    machine = machine_usage() - machine_before
    kinds |= servers()  # server processes started meanwhile (new connections' backends)
    result = report(run, await all_states(store), before, usages(kinds), kinds)
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
