"""`orderflow bench` end to end: it starts its own topology, measures, and cleans up."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import asyncpg
import pytest

from tests.conftest import POSTGRES_URL, RABBITMQ_URL
from tests.support.topology import FAST

pytestmark = [pytest.mark.rabbitmq, pytest.mark.postgres]


def bench(*args: str) -> dict:
    env = (
        os.environ
        | FAST
        | {
            "ORDERFLOW_STORE_URL": POSTGRES_URL,
            "ORDERFLOW_RABBITMQ_URL": RABBITMQ_URL,
            "ORDERFLOW_HEARTBEAT_S": "0.5",
            "ORDERFLOW_LOG_LEVEL": "WARNING",
        }
    )
    result = subprocess.run(
        [sys.executable, "-m", "services.cli", "bench", "--json", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=180,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return dict(json.loads(result.stdout))


async def _bench_schemas() -> set[str]:
    connection = await asyncpg.connect(POSTGRES_URL)
    try:
        rows = await connection.fetch(
            "SELECT schema_name FROM information_schema.schemata WHERE schema_name LIKE 'bench%'"
        )
        return {r["schema_name"] for r in rows}
    finally:
        await connection.close()


async def test_bench_reports_throughput_latency_and_process_costs_then_cleans_up() -> None:
    before = await _bench_schemas()
    result = bench("--orders", "40", "--schedulers", "2")
    assert result["terminal"] == 40 and result["by_state"] == {"Processed": 40}
    assert result["orders_per_s"] > 0
    latency = result["latency_s"]
    assert 0 < latency["p50"] <= latency["p95"] <= latency["p99"] <= latency["max"]
    assert set(result["step_latency_s"]) == {"reserve", "charge", "ship"}
    kinds = result["processes"]
    assert set(kinds) == {
        "submission",
        "scheduler",
        "supervisor",
        "agent-inventory",
        "agent-payment",
        "agent-shipping",
        # The remote stand-in and the local servers, so that the report accounts for the
        # whole machine's CPU.
        "remote (stand-in)",
        "rabbitmq (server)",
        "postgresql (server)",
    }
    assert kinds["scheduler"]["processes"] == 2
    assert all(k["peak_rss_mib"] > 10 for k in kinds.values())
    # The processes on every order's path used CPU for it (the supervisor may idle throughout).
    busy = [k for name, k in kinds.items() if name != "supervisor"]
    assert all(k["cpu_ms_per_order"] > 0 for k in busy)
    assert result["settings"]["schedulers"] == 2
    machine = result["machine"]
    assert machine["cores"] == os.cpu_count()
    assert 0 < machine["utilisation"] <= 1
    listed = sum(k["cpu_s"] for k in kinds.values())
    assert machine["busy_cpu_s"] >= 0.5 * listed, "the machine's busy time covers the processes"
    # Each order needs at least its state writes (four) and its order insert.
    assert result["store_transactions_per_order"] >= 5
    assert await _bench_schemas() == before, "the benchmark's hub is dropped"


async def test_bench_recovery_times_an_orphaned_step() -> None:
    result = bench("--recovery", "--orders", "100")
    assert result["orphaned_orders"] >= 5
    assert result["first_recovered_order"]
    assert result["bound_s"] == 2 + 0.3 + 1  # the FAST step timeout and supervisor interval
    assert 0 < result["kill_to_first_completion_s"] < 30
