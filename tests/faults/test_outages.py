"""Outages longer than any hold, and a reconnect in every intake state, on private servers.

The suite's own PostgreSQL and RabbitMQ (never the machine's) are stopped for longer than the
patience of the processes holding through them: no accepted order may be dead-lettered or parked
for it, and none lost.
"""

from __future__ import annotations

import asyncio
import json

import pytest

from harness.nemesis.servers import PrivatePostgres, PrivateRabbitMQ
from shared.domain.states import ProcessState
from tests.faults.conftest import FaultRun, everywhere
from tests.support.topology import Topology
from tests.support.waiting import eventually

pytestmark = [pytest.mark.rabbitmq, pytest.mark.postgres, pytest.mark.faults]

PATIENCE = {"ORDERFLOW_OUTAGE_PATIENCE_S": "1", "ORDERFLOW_RETRY_DELAY_S": "0.5"}
"""A hold of one second: any outage of these tests lasts many times the patience."""
RETURNED = "message returned to its queue"


def dead_letters(topo: Topology) -> list[object]:
    listed = topo.cli("dlq", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    return list(json.loads(listed.stdout)["messages"])


def occurrences(topo: Topology, text: str) -> int:
    return sum(topo.logs(label).count(text) for label in topo.procs)


async def test_a_store_outage_many_holds_long_dead_letters_no_accepted_order(
    private_topo: Topology, private_postgres: PrivatePostgres
) -> None:
    topo = private_topo
    run = FaultRun(topo, "PostgreSQL down for 8+ holds")
    everywhere(topo, **PATIENCE)
    await topo.start_all()
    run.submit(40, seed=81)
    await run.wait_for(ProcessState.PROCESSED, 5)
    await asyncio.to_thread(private_postgres.stop)
    run.struck()
    try:
        # Accepted while the store is away: each waits its turn through the outage.
        more = await asyncio.to_thread(
            topo.cli, "submit", "--json", "--count", "20", "--seed", "82"
        )
        assert more.returncode == 0, more.stderr
        run.order_ids += json.loads(more.stdout)["order_ids"]

        # More returns than the redelivery limit (5) allows deliveries: before, each return
        # counted, and these orders were dead-lettered `redelivery-limit`.
        # (Or, as before the fix, dead-lettered: then this fails at once, on what it checks.)
        def dead_lettered() -> bool:
            listed = topo.cli("dlq", "list", "--json")
            return listed.returncode == 0 and bool(json.loads(listed.stdout)["messages"])

        async def returned_often() -> bool:
            returns = topo.logs("submission").count(RETURNED)
            return returns >= 8 or await asyncio.to_thread(dead_lettered)

        await eventually(returned_often, timeout=90, what="submission's messages returned 8 times")
        assert not await asyncio.to_thread(dead_lettered), "accepted orders were dead-lettered"
        assert all(p.poll() is None for p in topo.procs.values())
    finally:
        await asyncio.to_thread(private_postgres.start)
    await topo.connect_store()
    states = await run.settle(timeout=180)
    assert len(states) == 60
    assert all(s.process_state is ProcessState.PROCESSED for s in states)
    assert dead_letters(topo) == []


async def test_a_broker_outage_longer_than_the_publish_hold_parks_no_order(
    private_topo: Topology, private_rabbitmq: PrivateRabbitMQ
) -> None:
    topo = private_topo
    run = FaultRun(topo, "RabbitMQ down for 25 publish holds")
    # Few orders at a time, each step slow: most are still to run when the broker goes.
    everywhere(topo, ORDERFLOW_SCHEDULER_INFLIGHT="4", **PATIENCE)
    await topo.start_all(schedulers=2, ORDERFLOW_REMOTE_LATENCY_MS="200")
    run.submit(200, seed=83)
    await run.wait_for(ProcessState.PROCESSED, 10)
    await asyncio.to_thread(private_rabbitmq.stop_app)
    run.struck()
    try:
        assert await run.settled_count() < 150, "the outage came too late to prove anything"

        async def holding() -> bool:
            return occurrences(topo, "could not send a step request; holding the order") >= 1

        await eventually(holding, timeout=60, what="a scheduler holding a step request")
        # The fault is the outage's length: long enough that an attempt giving up at the
        # patience would be recovered, claimed again and refused again up to the failure
        # threshold (5 failures, 2 s deadlines): about 15 s. Not a wait for a condition.
        await asyncio.sleep(25)
        assert all(p.poll() is None for p in topo.procs.values())
    finally:
        await asyncio.to_thread(private_rabbitmq.start_app)
    states = await run.settle(timeout=180)
    assert all(s.process_state is ProcessState.PROCESSED for s in states), {
        s.order_id: s.process_state for s in states if s.process_state is not ProcessState.PROCESSED
    }
    assert dead_letters(topo) == []
    assert occurrences(topo, "longer than the outage patience; still holding") >= 1


async def test_paused_intake_resumes_after_a_broker_restart(
    private_topo: Topology, private_rabbitmq: PrivateRabbitMQ
) -> None:
    """Submission paused at the backlog threshold when RabbitMQ restarts takes orders again
    once the backlog falls: no consumer is lost by a reconnect, whatever state it was in."""
    topo = private_topo
    run = FaultRun(topo, "RabbitMQ restarted while intake paused")
    everywhere(topo, ORDERFLOW_BACKLOG_THRESHOLD="20", ORDERFLOW_BACKLOG_CHECK_S="0.2")
    topo.serve("remote", "remote")
    topo.serve("submission", "submission")
    run.submit(120, seed=84)

    async def paused() -> bool:
        return "submission paused" in topo.logs("submission")

    await eventually(paused, timeout=60, what="submission paused at the backlog threshold")
    await asyncio.to_thread(private_rabbitmq.stop_app)
    run.struck()
    await asyncio.to_thread(private_rabbitmq.start_app)

    # Now the backlog falls: the rest of the orders must be taken.
    await topo.start_all()
    states = await run.settle(timeout=240)
    assert len(states) == 120
    assert all(s.process_state is ProcessState.PROCESSED for s in states)
    assert "submission resumed" in topo.logs("submission")
