"""The servers themselves restarting under load: RabbitMQ and PostgreSQL.

These tests stop the machine's own servers for a few seconds; each restarts its server in a
`finally`, whatever happens, and waits until it answers again before the next test runs.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from shared.domain.states import ProcessState
from shared.store.postgres import PostgresStore
from tests.conftest import POSTGRES_URL
from tests.faults.conftest import FaultRun, everywhere
from tests.support.topology import Topology
from tests.support.waiting import eventually

pytestmark = [pytest.mark.rabbitmq, pytest.mark.postgres, pytest.mark.faults]


def _run(*cmd: str) -> None:
    subprocess.run(cmd, check=True, capture_output=True, timeout=120)


def _rabbitmq_up() -> bool:
    return subprocess.run(["rabbitmqctl", "await_startup"], capture_output=True).returncode == 0


@contextmanager
def rabbitmq_stopped() -> Iterator[None]:
    """RabbitMQ's application stopped (every connection dropped), then started again."""
    if shutil.which("rabbitmqctl") is None:
        pytest.fail("rabbitmqctl is needed to restart RabbitMQ", pytrace=False)
    _run("rabbitmqctl", "stop_app")
    try:
        yield
    finally:
        _run("rabbitmqctl", "start_app")
        _run("rabbitmqctl", "await_startup")


def _pg_cluster() -> tuple[str, str]:
    versions = sorted(os.listdir("/etc/postgresql")) if Path("/etc/postgresql").exists() else []
    if not versions or shutil.which("pg_ctlcluster") is None:
        pytest.fail("pg_ctlcluster is needed to restart PostgreSQL", pytrace=False)
    return versions[-1], "main"


@contextmanager
def postgres_stopped() -> Iterator[None]:
    version, cluster = _pg_cluster()
    ctl = ("pg_ctlcluster", "--skip-systemctl-redirect", version, cluster)
    _run(*ctl, "stop", "--", "-m", "fast")
    try:
        yield
    finally:
        _run(*ctl, "start")
        _run("pg_isready", "-q", "-t", "60", "-h", "127.0.0.1", "-p", "5432")


async def test_rabbitmq_restart_under_load(topo: Topology) -> None:
    run = FaultRun(topo, "RabbitMQ restarted under load")
    # Deadlines long enough that the backlog of 300 orders on a slow machine costs no recovery:
    # what this test counts is what the restart costs.
    everywhere(topo, ORDERFLOW_STEP_TIMEOUT_S="5")
    await topo.start_all(schedulers=2)
    run.submit(300, seed=41)
    await run.wait_for(ProcessState.PROCESSED, 50)

    with rabbitmq_stopped():
        run.struck()
        # A publisher sees the failure; nothing is silently lost.
        refused = await asyncio.to_thread(topo.cli, "submit", "--json", "--count", "1", timeout=60)
        assert refused.returncode != 0, refused.stdout
        assert "orderflow: error" in refused.stderr
        # The processes stay up through the outage, waiting for the broker.
        assert all(p.poll() is None for p in topo.procs.values())

    states = await run.settle(timeout=120)
    assert all(s.process_state is ProcessState.PROCESSED for s in states)
    assert all(p.poll() is None for p in topo.procs.values()), "every process reconnected"
    # And the restarted broker takes new orders.
    after = FaultRun(topo, "-")
    after.submit(10, seed=42)
    await topo.wait_settled(310, timeout=60)
    for order_id in after.order_ids:
        state = await topo.store.get_state(order_id)
        assert state is not None and state.process_state is ProcessState.PROCESSED


async def test_postgresql_restart_under_load(topo: Topology) -> None:
    run = FaultRun(topo, "PostgreSQL restarted under load")
    # Deadlines long enough that the backlog of 300 orders on a slow machine costs no recovery:
    # what this test counts is what the restart costs.
    everywhere(topo, ORDERFLOW_STEP_TIMEOUT_S="5")
    await topo.start_all(schedulers=2)
    run.submit(300, seed=43)
    await run.wait_for(ProcessState.PROCESSED, 50)

    with postgres_stopped():
        run.struck()
        # While the store is down, orders still arrive and wait on the queue.
        more = await asyncio.to_thread(topo.cli, "submit", "--json", "--count", "20", timeout=60)
        assert more.returncode == 0, more.stderr
        run.order_ids += json.loads(more.stdout)["order_ids"]

        async def holding() -> bool:
            return "a server is unavailable; holding the message" in topo.logs("submission")

        await eventually(holding, timeout=20, what="submission holding messages")
        assert all(p.poll() is None for p in topo.procs.values())

    # The test's own pool lost its connections with the server; take fresh ones.
    await topo.store.close()
    topo.store = await PostgresStore.connect(
        POSTGRES_URL, topo.hub, pool_size=5, timeout=5, command_timeout=10
    )
    states = await run.settle(timeout=120)
    assert len(states) == 320
    assert all(s.process_state is ProcessState.PROCESSED for s in states)
    assert all(p.poll() is None for p in topo.procs.values()), "every process resumed"
