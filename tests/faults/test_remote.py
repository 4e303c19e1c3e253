"""The remote service misbehaving: hanging, declining, failing undos, a full outage."""

from __future__ import annotations

import pytest

from shared.domain.journal import AlertKind, HistoryEventType, UndoStatus
from shared.domain.states import ErrorKind, ProcessState, StepStatus
from tests.faults.conftest import FaultRun, alerts_for, everywhere
from tests.support.topology import Topology, all_orders
from tests.support.waiting import eventually

pytestmark = [pytest.mark.rabbitmq, pytest.mark.postgres, pytest.mark.faults]


async def test_the_remote_service_hanging(topo: Topology) -> None:
    run = FaultRun(topo, "remote service hangs every call for 3 s, then recovers")
    await topo.start_all(ORDERFLOW_REMOTE_HANG_RATE="1", ORDERFLOW_REMOTE_HANG_S="3")
    run.struck()
    run.submit(60, seed=31)

    async def abandoned() -> bool:
        states = await all_orders(topo)
        return sum(1 for s in states if s.failure_count >= 1) >= 20

    await eventually(abandoned, timeout=30, what="hung steps expiring and being recovered")
    await topo.remote.set_faults(hang_rate=0)

    states = await run.settle(timeout=90)
    assert all(s.process_state is ProcessState.PROCESSED for s in states)
    # The hung calls applied their effects late, after their attempts gave up waiting; the
    # recovered attempts got the first outcome back (same idempotency key), not a second effect.
    assert sum(1 for s in states if s.attempt >= 2) >= 20


async def test_declines_trigger_compensation(topo: Topology) -> None:
    run = FaultRun(topo, "20% of payments declined, 10% transient errors (2 schedulers)")
    await topo.start_all(
        schedulers=2,
        ORDERFLOW_REMOTE_DECLINE_RATE="0.2",
        ORDERFLOW_REMOTE_TRANSIENT_ERROR_RATE="0.1",
    )
    run.struck()
    run.submit(150, seed=32)

    states = await run.settle(timeout=90)
    compensated = [s for s in states if s.process_state is ProcessState.COMPENSATED]
    assert len(compensated) + sum(s.process_state is ProcessState.PROCESSED for s in states) == 150
    assert len(compensated) >= 15
    effects = await topo.remote.ledger()
    released = [e["order_id"] for e in effects if e["operation"] == "inventory.release"]
    assert sorted(released) == sorted(s.order_id for s in compensated)
    for state in compensated:
        log = await topo.store.read_compensation(state.order_id)
        assert [e.step for e in log] == ["reserve", "charge"], "undo log in step order"
        assert all(e.status is UndoStatus.DONE for e in log)
        events = [e.type for e in await topo.history(state.order_id)]
        assert events.index(HistoryEventType.COMPENSATION_STARTED) < events.index(
            HistoryEventType.COMPENSATION_COMPLETED
        )


async def test_an_undo_that_fails_then_succeeds(topo: Topology) -> None:
    run = FaultRun(topo, "every release fails until fixed; operator compensates again")
    everywhere(topo, ORDERFLOW_FAILURE_THRESHOLD="2")
    await topo.start_all(
        ORDERFLOW_REMOTE_DECLINE_RATE="1", ORDERFLOW_REMOTE_FAIL_OPERATIONS="inventory.release"
    )
    run.struck()
    ids = run.submit(10, seed=33)

    await run.wait_for(ProcessState.COMPENSATION_FAILED, 10, timeout=60)
    alerts = await alerts_for(topo, AlertKind.COMPENSATION_FAILED, ids)
    assert set(alerts) == set(ids)
    for order_id in ids:
        state = await topo.store.get_state(order_id)
        assert state is not None and state.error is not None
        assert state.error.kind is ErrorKind.COMPENSATION
        assert state.locked_by is None
    effects = await topo.remote.ledger()
    assert not [e for e in effects if e["operation"] == "inventory.release"]

    # The operator fixes the cause, then compensates the orders again.
    await topo.remote.set_faults(fail_operations=[])
    result = topo.cli("orders", "compensate", *ids, "--by", "oncall")
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("CompensationFailed -> Compensating") == 10

    states = await run.settle(timeout=60, all_in=ProcessState.COMPENSATED)
    for state in states:
        assert state.steps["reserve"].status is StepStatus.COMPENSATED
    effects = await topo.remote.ledger()
    released = [e["order_id"] for e in effects if e["operation"] == "inventory.release"]
    assert sorted(released) == sorted(ids), "each reservation released exactly once"


async def test_a_full_remote_outage_parks_orders_until_resubmitted(topo: Topology) -> None:
    run = FaultRun(topo, "remote outage: breakers open, orders park; resubmitted after it ends")
    everywhere(topo, ORDERFLOW_FAILURE_THRESHOLD="2", ORDERFLOW_BREAKER_FAIL_MAX="3")
    await topo.start_all()
    ids = run.submit(5, seed=34)
    await run.wait_for(ProcessState.PROCESSED, 5)
    run.order_ids.clear()

    await topo.remote.set_faults(outage=True)
    run.struck()
    ids = run.submit(50, seed=35)
    await run.wait_for(ProcessState.ERROR, 50, timeout=90)
    # orderflow's words for an open circuit (services/agents/breakers.py), in the agent's line
    # about the step it could not run
    assert "circuit open: inventory." in topo.logs("inventory"), "the breaker opened, failed fast"
    for order_id in ids:
        state = await topo.store.get_state(order_id)
        assert state is not None and state.error is not None
        assert state.error.kind in (ErrorKind.RECOVERY_LIMIT, ErrorKind.BUDGET_EXHAUSTED)
    alerts = await alerts_for(topo, AlertKind.ORDER_ERROR, ids)
    assert set(alerts) == set(ids)

    await topo.remote.set_faults(outage=False)
    result = topo.cli("orders", "resubmit", *ids, "--by", "oncall")
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("Error -> Pending") == 50

    states = await run.settle(timeout=90, all_in=ProcessState.PROCESSED)
    for state in states:
        resubmitted = await topo.history(state.order_id, HistoryEventType.RESUBMITTED)
        assert [e.data["by"] for e in resubmitted] == ["oncall"]


async def test_the_retry_budget_bounds_remote_attempts_across_every_layer(topo: Topology) -> None:
    run = FaultRun(topo, "every remote call fails transiently: the retry budget is spent")
    # 5 attempts end to end, at most 2 per request: 2 + 2 + 1 calls over three attempts (two
    # supervisor recoveries), then the fourth attempt finds the budget spent.
    everywhere(
        topo,
        ORDERFLOW_RETRY_BUDGET="5",
        ORDERFLOW_AGENT_ATTEMPTS_PER_REQUEST="2",
        ORDERFLOW_BREAKER_FAIL_MAX="100",
        ORDERFLOW_FAILURE_THRESHOLD="10",
    )
    await topo.start_all(ORDERFLOW_REMOTE_TRANSIENT_ERROR_RATE="1")
    run.struck()
    [order_id] = run.submit(1, seed=36)

    [state] = await run.settle(timeout=60)
    assert state.process_state is ProcessState.ERROR
    assert state.error is not None and state.error.kind is ErrorKind.BUDGET_EXHAUSTED
    assert (state.retry_budget.used, state.retry_budget.limit) == (5, 5)
    assert state.attempt == 4
    stats = await topo.remote.stats()
    assert stats["calls"] == {"503": 5}, "no layer retried beyond the budget"
    await alerts_for(topo, AlertKind.ORDER_ERROR, [order_id])
    [alert] = [a for a in await topo.store.list_alerts(limit=100) if a.order_id == order_id]
    assert alert.kind is AlertKind.ORDER_ERROR
    assert "retry budget of 5 attempts spent" in alert.message
