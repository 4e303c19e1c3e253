"""The servers themselves restarting under load: RabbitMQ and PostgreSQL.

These tests stop the fault suite's private servers (`private_topo`, harness/nemesis/servers.py),
never the machine's own: each restarts its server in a `finally`, whatever happens, and waits until
it answers again before the next test runs.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest

from harness.nemesis.servers import PrivatePostgres, PrivateRabbitMQ
from shared.domain.states import ProcessState
from tests.faults.conftest import FaultRun, everywhere
from tests.support.topology import Topology
from tests.support.waiting import eventually

pytestmark = [pytest.mark.rabbitmq, pytest.mark.postgres, pytest.mark.faults]


@asynccontextmanager
async def rabbitmq_stopped(server: PrivateRabbitMQ) -> AsyncIterator[None]:
    """RabbitMQ's application stopped (every connection dropped, the node stays), then started
    again."""
    await asyncio.to_thread(server.stop_app)
    try:
        yield
    finally:
        await asyncio.to_thread(server.start_app)


@asynccontextmanager
async def postgres_stopped(server: PrivatePostgres) -> AsyncIterator[None]:
    """PostgreSQL shut down ("fast": every session ended), then started again on its data."""
    await asyncio.to_thread(server.stop)
    try:
        yield
    finally:
        await asyncio.to_thread(server.start)


async def test_rabbitmq_restart_under_load(
    private_topo: Topology, private_rabbitmq: PrivateRabbitMQ
) -> None:
    topo = private_topo
    run = FaultRun(topo, "RabbitMQ restarted under load")
    # Deadlines long enough that the backlog of 300 orders on a slow machine costs no recovery:
    # what this test counts is what the restart costs.
    everywhere(topo, ORDERFLOW_STEP_TIMEOUT_S="5")
    await topo.start_all(schedulers=2)
    run.submit(300, seed=41)
    await run.wait_for(ProcessState.PROCESSED, 50)

    async with rabbitmq_stopped(private_rabbitmq):
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


async def test_postgresql_restart_under_load(
    private_topo: Topology, private_postgres: PrivatePostgres
) -> None:
    topo = private_topo
    run = FaultRun(topo, "PostgreSQL restarted under load")
    # Deadlines long enough that the backlog of 300 orders on a slow machine costs no recovery:
    # what this test counts is what the restart costs.
    everywhere(topo, ORDERFLOW_STEP_TIMEOUT_S="5")
    await topo.start_all(schedulers=2)
    run.submit(300, seed=43)
    await run.wait_for(ProcessState.PROCESSED, 50)

    async with postgres_stopped(private_postgres):
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
    await topo.connect_store()
    states = await run.settle(timeout=120)
    assert len(states) == 320
    assert all(s.process_state is ProcessState.PROCESSED for s in states)
    assert all(p.poll() is None for p in topo.procs.values()), "every process resumed"
