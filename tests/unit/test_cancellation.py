"""Cancellation (DESIGN §4, the customer's rows): what becomes of an order in each state, and
the real processes around it in burst mode on the memory adapters under virtual time
(tests/support/memory_hub.py)."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.operator.cancellation import cancel_order, status_teller
from shared.domain.cancellation import CANCELLABLE, cancel, nothing_sent, refusal
from shared.domain.journal import HistoryEventType as H
from shared.domain.messages import OrderStatus
from shared.domain.models import StepState
from shared.domain.states import SETTLED_STATES, TERMINAL_STATES, ErrorKind, ProcessState
from shared.domain.states import StepStatus as S
from shared.domain.timing import utcnow
from shared.domain.updates import apply, matches
from shared.domain.workflow import ORDER_WORKFLOW
from shared.errors import IllegalTransition
from shared.reporting import Reporter
from tests.support.factories import order_pair
from tests.support.memory_hub import MemoryHub, run

P = ProcessState
NOW = utcnow()


def test_cancelled_is_terminal_and_settled_everywhere() -> None:
    assert P.CANCELLED in TERMINAL_STATES and P.CANCELLED in SETTLED_STATES
    assert P.CANCELLED in SETTLED_STATES


@given(
    state=st.sampled_from(list(P)),
    attempts=st.lists(st.integers(0, 3), min_size=3, max_size=3),
    locked=st.sampled_from([None, "o-1:1", "o-1:2"]),
)
def test_cancel_decides_by_state_and_by_what_was_sent(
    state: ProcessState, attempts: list[int], locked: str | None
) -> None:
    _, record = order_pair("o-1", now=NOW)
    steps = {
        name: StepState(status=S.COMPLETED if n else S.NOT_STARTED, attempts=n)
        for name, n in zip(record.steps, attempts, strict=True)
    }
    record = record.model_copy(update={"process_state": state, "steps": steps, "locked_by": locked})
    if state not in CANCELLABLE:
        assert refusal(record) is not None
        with pytest.raises(IllegalTransition, match="cannot cancel"):
            cancel(record, now=NOW, by="shop-1")
        return
    update = cancel(record, now=NOW, by="shop-1")
    assert matches(record, update.expect)
    after = apply(record, update.changes)
    if state is P.PENDING and not any(attempts):
        assert after.process_state is P.CANCELLED
    else:  # something may have been done: it is undone
        assert after.process_state is P.COMPENSATING and after.next_attempt_at == NOW
    assert after.locked_by is None and after.complete_by is None
    assert after.error is not None and after.error.kind is ErrorKind.CANCELLED
    assert "shop-1" in after.error.message
    # The attempt that held it is fenced out: its writes expect Processing and its lock.
    assert after.process_state is not P.PROCESSING
    # The order as read, and only as read: a change since makes it match nothing.
    assert not matches(record.model_copy(update={"updated_at": utcnow()}), update.expect)
    assert not matches(record.model_copy(update={"locked_by": "o-1:9"}), update.expect)


def test_a_processed_order_refuses_with_the_reason() -> None:
    _, record = order_pair("o-1", now=NOW)
    done = record.model_copy(update={"process_state": P.PROCESSED})
    assert "Processed" in (refusal(done) or "")
    assert not nothing_sent(record.model_copy(update={"steps": {"x": StepState(attempts=1)}}))


async def _cancel(hub: MemoryHub, order_id: str) -> str:
    runtime = await hub.runtime("operator")
    reporter = Reporter(hub.store, runtime.publisher, hub.names, "shop-1")
    outcome = await cancel_order(hub.store, order_id, by="shop-1", tell=status_teller(reporter))
    return str(outcome)


def test_a_pending_order_is_cancelled_at_once_and_never_runs() -> None:
    async def scenario(hub: MemoryHub) -> None:
        placed = await hub.place()
        await hub.submission()
        assert await _cancel(hub, placed.order_id) == "Pending -> Cancelled"
        await hub.scheduler()
        state = await hub.state(placed)
        assert state.process_state is P.CANCELLED
        assert await hub.effects(placed) == []
        history = [e.type for e in await hub.store.read_history(placed.order_id)]
        assert history[-1] is H.CANCELLED
        await hub.sleep(0.1)
        assert placed.statuses[-1] is OrderStatus.CANCELLED
        again = await _cancel(hub, placed.order_id)
        assert again.startswith("refused:") and "Cancelled already" in again

    run(scenario)


def test_a_processing_order_with_a_hanging_step_is_fenced_out_and_compensated() -> None:
    async def scenario(hub: MemoryHub) -> None:
        placed = await hub.place()
        await hub.submission()
        attempt = asyncio.create_task(hub.scheduler())
        for _ in range(100):  # the first step's request is out, and hangs
            await hub.sleep(0.05)
            state = await hub.state(placed)
            if any(s.status is S.RUNNING for s in state.steps.values()):
                break
        assert state.process_state is P.PROCESSING
        assert await _cancel(hub, placed.order_id) == "Processing -> Compensating"
        hub.faults.hang_rate = 0.0  # the undos do not hang
        await attempt  # the fenced attempt stops; the same burst compensates the order
        await hub.sleep(hub.faults.hang_s)  # the hung call ends: refused, or made and undone
        final = await hub.state(placed)
        assert final.process_state is P.COMPENSATED
        assert final.error is not None and final.error.kind is ErrorKind.CANCELLED
        effects = await hub.effects(placed)
        made = {op for op, outcome in effects if outcome == "applied"}
        for step in ORDER_WORKFLOW.steps:  # DESIGN §8.2: every effect it made is undone
            assert step.operation not in made or step.undo in made, effects
        assert ("inventory.release", "noop") in effects or ("inventory.release", "applied") in (
            effects
        ), "the running step's undo was asked, whether or not its call had landed"
        events = await hub.store.read_history(placed.order_id)
        history = [e.type for e in events]
        assert history.index(H.CANCELLED) < history.index(H.COMPENSATION_COMPLETED)
        compensator = {e.instance_id for e in events if e.type is H.COMPENSATION_STARTED}
        assert compensator and state.locked_by not in compensator, "a new attempt undid it"
        assert H.LEASE_LOST in history, "the fenced attempt wrote nothing after the cancel"
        await hub.sleep(0.1)
        assert placed.statuses[-1] is OrderStatus.COMPENSATED

    run(scenario, hang_rate=1.0, hang_s=5.0)
