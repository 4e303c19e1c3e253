"""A benchmark's figures, from the orders' records and the processes' /proc readings."""

from __future__ import annotations

import math
import os
from collections import defaultdict
from typing import Any

from harness.bench.load import Run
from harness.bench.procfs import MachineUsage, ProcUsage
from shared.domain.models import StateRecord
from shared.domain.states import SETTLED_STATES, ProcessState


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


def _rounded(values: list[float]) -> dict[str, float]:
    return {k: round(v, 4) for k, v in latency_summary(values).items()}


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
    """The run's figures: its orders' states, throughput, latencies (publish to Processed, and
    per step), each process kind's CPU per order and peak memory, supervisor recoveries."""
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
    return {
        "orders": run.orders,
        "terminal": sum(by_state.values()),
        "by_state": dict(by_state),
        "wall_s": round(wall, 3),
        "orders_per_s": round(len(mine) / wall, 1) if wall else 0.0,
        "latency_s": _rounded(latencies),
        "step_latency_s": {
            name: _rounded(values) for name, values in sorted(step_latencies(mine).items())
        },
        "processes": process_costs(kinds, before, after, orders=max(1, len(mine))),
        "recoveries": sum(max(0, s.attempt - 1) for s in mine),
        "settings": run.config,
    }


def step_latencies(states: list[StateRecord]) -> dict[str, list[float]]:
    """Each step's durations, from start to completion, over the orders that completed it."""
    steps: dict[str, list[float]] = defaultdict(list)
    for s in states:
        for name, step in s.steps.items():
            if step.completed_at is not None and step.started_at is not None:
                steps[name].append((step.completed_at - step.started_at).total_seconds())
    return steps


def process_costs(
    kinds: dict[int, str],
    before: dict[int, ProcUsage],
    after: dict[int, ProcUsage],
    *,
    orders: int,
) -> dict[str, dict[str, Any]]:
    """Per process kind: how many, CPU seconds (per order too) over the run, peak memory."""
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
    return {
        kind: {
            "processes": int(e["processes"]),
            "cpu_ms_per_order": round(1000 * e["cpu_s"] / orders, 3),
            "cpu_s": round(e["cpu_s"], 2),
            "peak_rss_mib": round(e["peak_rss_mib"], 1),
        }
        for kind, e in sorted(per_kind.items())
    }


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
