"""`orderflow bench --recovery`: kill -9 one of two schedulers while it has steps in flight, and
time until another attempt completes one of its orphaned steps, against the bound `step timeout
+ supervisor interval + 1 s`."""

from __future__ import annotations

import asyncio
import os
import signal
import tempfile
import time
from pathlib import Path
from typing import Any

from harness.bench.load import Run, publish, wait_settled
from harness.bench.run import Plan
from harness.bench.topology import cleanup, processes, topology, topology_env, wait_ready
from services.operator.views import all_states
from shared.bootstrap import connect_store, initialise
from shared.domain.journal import HistoryEventType
from shared.domain.states import ProcessState
from shared.errors import BenchFailed
from shared.store.port import StateStore

IN_FLIGHT = 5
"""Orders the victim must be running when it is killed."""


async def run_recovery(run: Run, plan: Plan) -> dict[str, Any]:
    """kill -9 one of two schedulers while it has steps in flight; time until another attempt
    completes one of its orphaned steps."""
    settings = run.settings
    faults = {"ORDERFLOW_REMOTE_LATENCY_MS": "100"}  # so that steps are in flight when it dies
    with tempfile.TemporaryDirectory(prefix="orderflow-bench-") as tmp:
        workdir = Path(tmp)
        store = await connect_store(settings)
        try:
            await initialise(settings)
            env = topology_env(settings, faults, workdir)
            async with topology(settings, schedulers=2, agents=1, env=env, workdir=workdir) as up:
                statuses = await wait_ready(store, processes(2, 1), up, timeout=60)
                victim = next(s for s in statuses if s.kind == "scheduler")
                run.rate = run.rate or 50.0
                publishing = asyncio.create_task(publish(settings, run, seed=plan.seed))
                orphans = await _in_flight(store, victim.name, timeout=30)
                os.kill(int(victim.data["pid"]), signal.SIGKILL)
                killed = time.monotonic()
                first = await _first_completion(store, orphans, timeout=plan.timeout)
                recovered_s = time.monotonic() - killed
                run.started = killed
                await wait_settled(store, run, plan.timeout)
                await publishing
        finally:
            await cleanup(settings, store, plan.keep)
            await store.close()
    bound = settings.workflow.step_timeout_s + settings.supervisor.supervisor_interval_s + 1
    return {
        "killed": victim.name,
        "orphaned_orders": len(orphans),
        "first_recovered_order": first,
        "kill_to_first_completion_s": round(recovered_s, 3),
        "bound_s": bound,
        "within_bound": recovered_s <= bound,
        "step_timeout_s": settings.workflow.step_timeout_s,
        "supervisor_interval_s": settings.supervisor.supervisor_interval_s,
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
        if len(running) >= IN_FLIGHT:
            return running
        await asyncio.sleep(0.05)
    raise BenchFailed(f"{owner} never had steps in flight")


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
    raise BenchFailed("no orphaned order was completed by another attempt")
