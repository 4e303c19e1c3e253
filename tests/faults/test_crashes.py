"""kill -9 of each process kind mid-run under load, and of a scheduler during compensation."""

from __future__ import annotations

import pytest

from shared.domain.coordination import SUPERVISOR_LEASE
from shared.domain.identity import attempt_of
from shared.domain.journal import HistoryEventType
from shared.domain.states import ProcessState, StepStatus
from tests.faults.conftest import FaultRun
from tests.support.topology import Topology, all_orders
from tests.support.waiting import eventually

pytestmark = [pytest.mark.rabbitmq, pytest.mark.postgres, pytest.mark.faults]


async def _owned_live(topo: Topology, label: str, state: ProcessState) -> int:
    owner = f"{topo.hub}-{label}"
    return sum(
        1
        for s in await all_orders(topo)
        if s.process_state is state and s.owner == owner and s.locked_by is not None
    )


async def test_kill_a_scheduler_mid_run(topo: Topology) -> None:
    run = FaultRun(topo, "kill -9 scheduler (1 of 2)")
    await topo.start_all(schedulers=2)
    run.submit(300, seed=11)

    async def busy() -> bool:
        return await _owned_live(topo, "scheduler-1", ProcessState.PROCESSING) >= 5

    await eventually(busy, timeout=30, what="scheduler-1 running orders")
    topo.kill("scheduler-1")
    run.struck()

    states = await run.settle(timeout=90)
    assert all(s.process_state is ProcessState.PROCESSED for s in states)
    orphans = [s for s in states if s.attempt >= 2]
    assert orphans, "the killed scheduler's orders were finished by later attempts"
    assert all(s.owner == f"{topo.hub}-scheduler-2" for s in orphans)


async def test_kill_an_agent_mid_run(topo: Topology) -> None:
    run = FaultRun(topo, "kill -9 payment agent, restarted")
    await topo.start_all()
    run.submit(200, seed=12)
    await run.wait_for(ProcessState.PROCESSED, 20)
    topo.kill("payment")
    run.struck()
    before = await run.settled_count()
    # Nothing gets past payment while no payment agent runs; then it comes back, as a restart
    # policy would bring it back.
    topo.serve("payment", "agent", "payment")

    states = await run.settle(timeout=90)
    assert before < len(states)
    assert all(s.process_state is ProcessState.PROCESSED for s in states)


async def test_kill_the_submission_process_mid_intake(topo: Topology) -> None:
    run = FaultRun(topo, "kill -9 submission, restarted")
    # The orders wait on <hub>.orders before submission starts, so the kill lands mid-intake.
    run.submit(400, seed=13)
    await topo.start_all()

    async def some_recorded() -> bool:
        # One count, looked at every 5 ms: submission takes a queue of orders in bursts (group
        # commits), and a probe of eight counts every 50 ms once saw 0 and then all 400.
        return await topo.store.count_in_states(frozenset(ProcessState)) >= 40

    await eventually(some_recorded, timeout=30, interval=0.005, what="submission recording")
    topo.kill("submission")
    run.struck()
    recorded = sum((await topo.counts()).values())
    assert recorded < 400, "the kill should land before every order is recorded"
    topo.serve("submission", "submission")

    states = await run.settle(timeout=120)
    assert len(states) == 400
    assert all(s.process_state is ProcessState.PROCESSED for s in states)
    for order_id in run.order_ids[:50]:
        submitted = await topo.history(order_id, HistoryEventType.ORDER_SUBMITTED)
        assert len(submitted) == 1, f"{order_id} recorded once"


async def test_kill_the_supervisor_leader_mid_run(topo: Topology) -> None:
    run = FaultRun(topo, "kill -9 supervisor leader (1 of 2), 15% hung calls")
    # Hung calls make work for the supervisor: their steps expire and must be recovered.
    await topo.start_all(
        supervisors=2, ORDERFLOW_REMOTE_HANG_RATE="0.15", ORDERFLOW_REMOTE_HANG_S="3"
    )

    async def leader() -> str | None:
        lease = await topo.store.lease_get(SUPERVISOR_LEASE)
        return lease.holder if lease is not None else None

    first = await eventually(leader, timeout=20, what="a supervisor leader")
    run.submit(150, seed=14)

    async def recovering() -> bool:
        return any(s.attempt >= 2 for s in await all_orders(topo))

    await eventually(recovering, timeout=30, what="the leader recovering expired steps")
    label = first.removeprefix(f"{topo.hub}-")
    topo.kill(label)
    run.struck()

    async def new_leader() -> str | None:
        holder = await leader()
        return holder if holder not in (None, first) else None

    second = await eventually(new_leader, timeout=20, what="the other supervisor taking over")
    await topo.remote.set_faults(hang_rate=0)
    states = await run.settle(timeout=90)
    assert all(s.process_state is ProcessState.PROCESSED for s in states)
    assert second != first
    assert '"recovered"' in topo.logs(second.removeprefix(f"{topo.hub}-"))


async def test_kill_a_scheduler_during_compensation(topo: Topology) -> None:
    run = FaultRun(topo, "kill -9 scheduler during compensation (1 of 2)")
    # Every payment is declined, and every release fails until the fault is cleared: the
    # compensations are in hand when scheduler-1 dies.
    await topo.start_all(
        schedulers=2,
        ORDERFLOW_REMOTE_DECLINE_RATE="1",
        ORDERFLOW_REMOTE_FAIL_OPERATIONS="inventory.release",
    )
    run.submit(40, seed=15)

    async def compensating() -> bool:
        return await _owned_live(topo, "scheduler-1", ProcessState.COMPENSATING) >= 3

    await eventually(compensating, timeout=30, what="scheduler-1 compensating orders")
    topo.kill("scheduler-1")
    run.struck()
    await topo.remote.set_faults(fail_operations=[])

    states = await run.settle(timeout=90)
    assert all(s.process_state is ProcessState.COMPENSATED for s in states)
    for state in states:
        assert state.steps["reserve"].status is StepStatus.COMPENSATED
    effects = await topo.remote.ledger()
    released = {e["order_id"] for e in effects if e["operation"] == "inventory.release"}
    assert released == set(run.order_ids)


# -- a scheduler killed at each point of an attempt (the crash drill: exactly there, not
# wherever a signal happens to land)

DRILLS = {
    "claim-uncommitted": "its claim made but not committed",
    "after-claim": "its claim committed, nothing else done",
    "after-request": "a step request sent, its reply not recorded",
    "after-undo-request": "an undo request sent during compensation",
}


@pytest.mark.parametrize("point", list(DRILLS))
async def test_a_scheduler_dies_at_each_point_of_an_attempt(topo: Topology, point: str) -> None:
    run = FaultRun(topo, f"scheduler exits {DRILLS[point]} (1 of 2)")
    undoing = point == "after-undo-request"
    # scheduler-1 carries the drill; it dies at its 5th attempt reaching the point, with work
    # in hand (at its first claim for `claim-uncommitted`, so it never commits one). Every
    # payment is declined in the compensation run, so the attempts undo. Claims of 5 at most
    # share the 60 orders between the schedulers: claimed 50 at a time and at most every 50 ms
    # (decision:claim-gap-50-ms), one scheduler could take all but a few, and scheduler-1 never
    # reach its
    # 5th (so it went, in CI and here).
    topo.serve(
        "scheduler-1",
        "scheduler",
        ORDERFLOW_FAULT_CRASH_AT=point,
        ORDERFLOW_FAULT_CRASH_AFTER="1" if point == "claim-uncommitted" else "5",
        ORDERFLOW_CLAIM_BATCH="5",
    )
    topo.serve("scheduler-2", "scheduler", ORDERFLOW_CLAIM_BATCH="5")
    remote = {"ORDERFLOW_REMOTE_DECLINE_RATE": "1"} if undoing else {}
    await topo.start_all(schedulers=2, **remote)
    run.submit(60, seed=16)

    async def died() -> bool:
        return topo.procs["scheduler-1"].poll() is not None

    await eventually(died, timeout=30, what=f"scheduler-1 exiting at {point}")
    run.struck()
    assert topo.procs["scheduler-1"].returncode == 137
    assert f"crash drill: exiting at {point}" in topo.logs("scheduler-1")

    final = ProcessState.COMPENSATED if undoing else ProcessState.PROCESSED
    states = await run.settle(timeout=90, all_in=final)
    dead = f"{topo.hub}-scheduler-1"
    history = {s.order_id: await topo.store.read_history(s.order_id) for s in states}
    started_by_dead = {
        order_id
        for order_id, events in history.items()
        if any(
            e.type is HistoryEventType.EXECUTION_STARTED and e.data.get("by") == dead
            for e in events
        )
    }
    if point == "claim-uncommitted":
        # The claim died with its transaction: its orders were claimed afresh, at attempt 1,
        # by the living scheduler, as if the dead one had never tried.
        assert not started_by_dead
        assert all(s.owner == f"{topo.hub}-scheduler-2" and s.attempt == 1 for s in states)
    else:
        # What the dead scheduler held was finished by later attempts of the other one (no
        # other fault makes a second attempt here). After its claim it died before recording
        # even ExecutionStarted, so its attempts are known by their numbers, not their events.
        orphans = [s for s in states if s.attempt >= 2]
        assert orphans, "the dead scheduler's orders were finished by later attempts"
        assert all(s.owner == f"{topo.hub}-scheduler-2" for s in orphans)
    effects = await topo.remote.ledger()
    if point == "after-request":
        # The agent acted on a request whose reply nobody recorded: the effect is the dead
        # attempt's, and the later attempt that finished the order, asking again under the same
        # idempotency key, got its outcome without a second effect (settle counts them).
        attempts = {s.order_id: s.attempt for s in states}
        assert any(
            attempt_of(e["fencing_token"]) == 1 and attempts[e["order_id"]] >= 2
            for e in effects
            if e["order_id"] in started_by_dead
        )
    if undoing:
        released = [e for e in effects if e["operation"] == "inventory.release"]
        assert sorted(e["order_id"] for e in released) == sorted(run.order_ids)
