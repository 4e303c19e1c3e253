"""The benchmark's arithmetic: percentiles, /proc readings and the report."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import timedelta

import pytest

from harness.bench.load import Run
from harness.bench.procfs import (
    MachineUsage,
    ProcUsage,
    children,
    machine_usage,
    proc_usage,
    servers,
)
from harness.bench.report import latency_summary, machine_report, percentile, report
from shared.config import Settings
from shared.domain.states import ProcessState, StepStatus
from shared.domain.timing import utcnow
from tests.support.factories import order_pair


@pytest.mark.parametrize(("q", "expected"), [(50, 50), (95, 95), (99, 99), (100, 100), (1, 1)])
def test_nearest_rank_percentiles(q: float, expected: float) -> None:
    assert percentile([float(v) for v in range(100, 0, -1)], q) == expected


def test_percentiles_of_nothing_and_of_one() -> None:
    assert latency_summary([]) == {"p50": 0.0, "p95": 0.0, "p99": 0.0, "max": 0.0, "mean": 0.0}
    assert latency_summary([0.25])["p99"] == 0.25


def test_proc_usage_reads_this_process_and_none_for_a_missing_one() -> None:
    usage = proc_usage(os.getpid())
    assert usage is not None and usage.cpu_s > 0 and usage.peak_rss_mib >= usage.rss_mib > 10
    assert proc_usage(2**22 + 12345) is None


def test_the_report_measures_publish_to_processed_and_cpu_per_order() -> None:
    now = utcnow()
    run = Run(Settings(), orders=2, rate=0, config={"schedulers": 1})
    states = []
    for i, delay in enumerate((0.5, 1.5)):
        _, s = order_pair(f"o-{i}", now=now)
        done = s.steps["reserve"].model_copy(
            update={
                "status": StepStatus.COMPLETED,
                "started_at": now,
                "completed_at": now + timedelta(seconds=0.1),
            }
        )
        states.append(
            s.model_copy(
                update={
                    "process_state": ProcessState.PROCESSED,
                    "updated_at": now + timedelta(seconds=delay),
                    "attempt": 1 + i,
                    "steps": {**s.steps, "reserve": done},
                }
            )
        )
        run.publish_at[s.order_id] = now
    run.started, run.finished = 10.0, 12.0
    before = {1: ProcUsage(1.0, 50, 50), 2: ProcUsage(2.0, 60, 60)}
    after = {1: ProcUsage(1.5, 70, 65), 2: ProcUsage(2.1, 80, 75)}
    result = report(run, states, before, after, {1: "scheduler", 2: "agent-payment"})
    # From the first publish to the last settling (1.5 s), not the bench's clock (2 s).
    assert result["orders_per_s"] == round(2 / 1.5, 1)
    assert report(Run(Settings(), orders=3, rate=0, config={}), [], {}, {}, {})["wall_s"] == 0
    assert result["latency_s"]["p50"] == 0.5 and result["latency_s"]["max"] == 1.5
    assert result["step_latency_s"]["reserve"]["p99"] == 0.1
    assert result["processes"]["scheduler"] == {
        "processes": 1,
        "cpu_ms_per_order": 250.0,
        "cpu_s": 0.5,
        "peak_rss_mib": 70.0,
    }
    assert result["recoveries"] == 1
    assert result["by_state"] == {"Processed": 2}


def test_the_machine_line_shows_saturation_and_what_the_table_leaves_out() -> None:
    processes = {"scheduler": {"cpu_s": 3.0}, "postgresql (server)": {"cpu_s": 4.0}}
    used = MachineUsage(30.0, 60.0, 9000) - MachineUsage(20.0, 40.0, 4000)
    machine = machine_report(used, processes, orders=1000)
    assert machine["utilisation"] == 0.5
    assert machine["cpu_ms_per_order"] == 10.0
    assert machine["unlisted_cpu_s"] == 3.0
    assert machine["context_switches_per_order"] == 5.0
    assert machine_report(MachineUsage(0.0, 0.0, 0), {}, orders=0)["utilisation"] == 0.0
    now = machine_usage()
    assert now.total_s >= now.busy_s > 0 and now.context_switches > 0


def test_servers_are_found_by_name_and_children_by_parent() -> None:
    assert set(servers().values()) <= {"rabbitmq (server)", "postgresql (server)"}
    # Asked of a fresh process: this test session's own may hold the fault suite's private
    # servers (session fixtures) as children.
    fresh = subprocess.run(
        [
            sys.executable,
            "-c",
            "import os; from harness.bench.procfs import children; print(children(os.getpid()))",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert fresh.stdout.strip() == "{}"
    assert children(-1) == {}
