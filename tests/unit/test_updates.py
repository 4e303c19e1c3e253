"""The conditional updates each transition asks for: what they expect and what they set."""

from __future__ import annotations

from datetime import timedelta

import pytest

from shared.domain.models import ErrorInfo
from shared.domain.states import ErrorKind, ProcessState, StepStatus
from shared.domain.timing import utcnow
from shared.domain.updates import (
    Changes,
    Expect,
    RecoveryPolicy,
    apply,
    chain,
    complete_step,
    extend_deadline,
    fail,
    matches,
    recover,
    release,
    start_step,
)
from shared.domain.workflow import ORDER_WORKFLOW
from shared.errors import IllegalTransition
from tests.support.factories import order_pair

S = timedelta(seconds=1)


def claimed(attempt: int = 1, budget: int = 10):
    _, state = order_pair("o-1", retry_budget=budget)
    now = utcnow()
    return state.model_copy(
        update={
            "process_state": ProcessState.PROCESSING,
            "attempt": attempt,
            "locked_by": f"o-1:{attempt}",
            "complete_by": now + 10 * S,
        }
    )


def test_start_step_reserves_its_allowance_and_sets_a_deadline() -> None:
    record = claimed()
    now = utcnow()
    u = start_step(record, "reserve", instance="o-1:1", now=now, timeout=5 * S, allowance=3)
    assert u.expect == Expect(process_state=frozenset({ProcessState.PROCESSING}), locked_by="o-1:1")
    after = apply(record, u.changes)
    step = after.steps["reserve"]
    assert (step.status, step.attempts, step.allowance) == (StepStatus.RUNNING, 1, 3)
    assert after.complete_by == now + 5 * S
    assert after.retry_budget.used == 3


def test_start_step_refuses_an_allowance_beyond_the_budget_and_a_completed_step() -> None:
    record = claimed(budget=2)
    with pytest.raises(ValueError):
        start_step(record, "reserve", instance="o-1:1", now=utcnow(), timeout=S, allowance=3)
    done = apply(
        record,
        complete_step(
            record,
            ORDER_WORKFLOW,
            "reserve",
            instance="o-1:1",
            now=utcnow(),
            result={},
            attempts_used=0,
        ).changes,
    )
    with pytest.raises(ValueError):
        start_step(done, "reserve", instance="o-1:1", now=utcnow(), timeout=S, allowance=1)


def test_complete_step_gives_back_unspent_attempts() -> None:
    record = claimed()
    running = apply(
        record,
        start_step(
            record, "reserve", instance="o-1:1", now=utcnow(), timeout=S, allowance=3
        ).changes,
    )
    u = complete_step(
        running,
        ORDER_WORKFLOW,
        "reserve",
        instance="o-1:1",
        now=utcnow(),
        result={"reservation": "r-1"},
        attempts_used=1,
    )
    after = apply(running, u.changes)
    assert after.retry_budget.used == 1
    assert after.steps["reserve"].status is StepStatus.COMPLETED
    assert after.process_state is ProcessState.PROCESSING
    assert after.locked_by == "o-1:1"


def test_completing_the_last_step_makes_the_order_processed_and_unlocked() -> None:
    record = claimed()
    u = complete_step(
        record, ORDER_WORKFLOW, "ship", instance="o-1:1", now=utcnow(), result={}, attempts_used=1
    )
    after = apply(record, u.changes)
    assert (after.process_state, after.locked_by, after.complete_by) == (
        ProcessState.PROCESSED,
        None,
        None,
    )


@pytest.mark.parametrize(
    ("compensate", "target"), [(False, ProcessState.ERROR), (True, ProcessState.COMPENSATING)]
)
def test_fail_parks_or_compensates(compensate: bool, target: ProcessState) -> None:
    record = claimed()
    err = ErrorInfo(kind=ErrorKind.PERMANENT, message="card declined", at=utcnow())
    u = fail(
        record,
        "charge",
        instance="o-1:1",
        now=utcnow(),
        error=err,
        attempts_used=1,
        compensate_within=timedelta(seconds=5) if compensate else None,
    )
    after = apply(record, u.changes)
    assert after.process_state is target
    assert after.error == err
    assert after.steps["charge"].status is StepStatus.FAILED
    if compensate:
        assert after.locked_by == "o-1:1", "the attempt goes on to compensate, still fenced"
        assert after.complete_by is not None
    else:
        assert (after.locked_by, after.complete_by) == (None, None)


def test_no_transition_from_a_state_the_table_does_not_allow() -> None:
    record = claimed().model_copy(update={"process_state": ProcessState.PROCESSED})
    with pytest.raises(IllegalTransition):
        start_step(record, "reserve", instance="o-1:1", now=utcnow(), timeout=S, allowance=1)
    with pytest.raises(IllegalTransition):
        complete_step(
            record,
            ORDER_WORKFLOW,
            "ship",
            instance="o-1:1",
            now=utcnow(),
            result={},
            attempts_used=1,
        )


def test_recover_expects_what_the_supervisor_saw_and_backs_off() -> None:
    record = claimed()
    running = apply(
        record,
        start_step(
            record, "reserve", instance="o-1:1", now=utcnow() - 20 * S, timeout=S, allowance=2
        ).changes,
    )
    now = utcnow()
    policy = RecoveryPolicy(failure_threshold=3, backoff=lambda n: n * 10 * S)
    u = recover(running, now=now, policy=policy)
    assert u.expect.locked_by == "o-1:1"
    assert u.expect.complete_by == running.complete_by
    after = apply(running, u.changes)
    assert (after.process_state, after.locked_by, after.failure_count) == (
        ProcessState.PENDING,
        None,
        1,
    )
    assert after.next_attempt_at == now + 10 * S
    assert after.steps["reserve"].status is StepStatus.NOT_STARTED
    assert after.steps["reserve"].error.kind is ErrorKind.DEADLINE
    assert after.retry_budget.used == 2, "a timed-out request's reserved attempts count as spent"


def test_recover_refuses_a_live_attempt() -> None:
    with pytest.raises(ValueError):
        recover(claimed(), now=utcnow(), policy=RecoveryPolicy(3, lambda n: S))


def test_matches_checks_every_named_field() -> None:
    record = claimed()
    assert matches(record, Expect())
    assert matches(
        record,
        Expect(
            locked_by="o-1:1",
            complete_by=record.complete_by,
            updated_at=record.updated_at,
            process_state=frozenset({ProcessState.PROCESSING}),
        ),
    )
    assert not matches(record, Expect(locked_by="o-1:2"))
    assert not matches(record, Expect(locked_by=None))
    assert not matches(record, Expect(complete_by=None))
    assert not matches(record, Expect(updated_at=record.updated_at - S))
    assert not matches(record, Expect(process_state=frozenset({ProcessState.PENDING})))
    assert matches(record, Expect(due_by=record.next_attempt_at))  # due at that very time
    assert not matches(record, Expect(due_by=record.next_attempt_at - S))


def test_changes_refuse_immutable_fields() -> None:
    for field in ("order_id", "created_at", "schema_version", "steps", "nonsense"):
        with pytest.raises(ValueError):
            Changes(fields={field: None})


def test_extend_deadline_moves_only_the_deadline_of_the_live_attempt() -> None:
    record = claimed()
    now = utcnow()
    u = extend_deadline(record, instance="o-1:1", now=now, timeout=7 * S)
    assert matches(record, u.expect)
    assert not matches(record.model_copy(update={"locked_by": "o-1:2"}), u.expect)
    after = apply(record, u.changes)
    assert after.complete_by == now + 7 * S
    assert after.retry_budget == record.retry_budget
    assert after.steps == record.steps
    assert after.process_state is ProcessState.PROCESSING
    compensating = record.model_copy(update={"process_state": ProcessState.COMPENSATING})
    assert matches(compensating, u.expect)
    with pytest.raises(ValueError):
        extend_deadline(
            record.model_copy(update={"process_state": ProcessState.ERROR, "locked_by": None}),
            instance="o-1:1",
            now=now,
            timeout=S,
        )


def test_release_gives_the_order_back_with_a_backoff_or_parks_it() -> None:
    record = claimed()
    now = utcnow()
    running = apply(
        record,
        start_step(
            record, "reserve", instance="o-1:1", now=now, timeout=5 * S, allowance=3
        ).changes,
    )
    error = ErrorInfo(kind=ErrorKind.TRANSIENT, message="inventory.reserve: HTTP 503", at=now)
    policy = RecoveryPolicy(failure_threshold=2, backoff=lambda n: n * 10 * S)
    u = release(
        running, "reserve", instance="o-1:1", now=now, error=error, attempts_used=2, policy=policy
    )
    assert u.expect == Expect(process_state=frozenset({ProcessState.PROCESSING}), locked_by="o-1:1")
    after = apply(running, u.changes)
    assert (after.process_state, after.locked_by, after.complete_by) == (
        ProcessState.PENDING,
        None,
        None,
    )
    assert after.failure_count == 1 and after.next_attempt_at == now + 10 * S
    assert after.retry_budget.used == 2, "only the attempts the agent spent"
    assert after.steps["reserve"].status is StepStatus.NOT_STARTED
    assert after.steps["reserve"].error == error
    again = running.model_copy(update={"failure_count": 1})
    parked = apply(
        again,
        release(
            again, "reserve", instance="o-1:1", now=now, error=error, attempts_used=0, policy=policy
        ).changes,
    )
    assert parked.process_state is ProcessState.ERROR
    assert parked.error is not None and parked.error.kind is ErrorKind.RECOVERY_LIMIT
    assert "HTTP 503" in parked.error.message


def test_a_chained_update_completes_one_step_and_starts_the_next_in_one_write() -> None:
    record = claimed()
    now = utcnow()
    running = apply(
        record,
        start_step(record, "reserve", instance="o-1:1", now=now, timeout=S, allowance=3).changes,
    )
    done = complete_step(
        running,
        ORDER_WORKFLOW,
        "reserve",
        instance="o-1:1",
        now=now,
        result={"reservation": "r-1"},
        attempts_used=1,
    )

    def start_charge(after_reserve):
        # The allowance comes from the budget as the completion leaves it (2 given back).
        assert after_reserve.retry_budget.used == 1
        return start_step(
            after_reserve, "charge", instance="o-1:1", now=now, timeout=5 * S, allowance=3
        )

    completed = apply(running, done.changes)
    u = chain(done, start_charge(completed), after_first=completed)
    assert u.expect == done.expect  # fenced like each of the two
    after = apply(running, u.changes)
    assert after.steps["reserve"].status is StepStatus.COMPLETED
    assert after.steps["reserve"].result == {"reservation": "r-1"}
    charge = after.steps["charge"]
    assert (charge.status, charge.attempts, charge.allowance) == (StepStatus.RUNNING, 1, 3)
    assert after.retry_budget.used == 4
    assert after.complete_by == now + 5 * S


def test_a_chain_refuses_a_second_update_of_another_attempt() -> None:
    record = claimed()
    done = complete_step(
        record,
        ORDER_WORKFLOW,
        "reserve",
        instance="o-1:1",
        now=utcnow(),
        result={},
        attempts_used=0,
    )
    completed = apply(record, done.changes)
    other = start_step(completed, "charge", instance="o-1:2", now=utcnow(), timeout=S, allowance=1)
    with pytest.raises(ValueError, match="would not match"):
        chain(done, other, after_first=completed)


def test_at_the_threshold_a_workflow_that_compensates_the_limit_goes_to_compensating() -> None:
    record = claimed().model_copy(update={"failure_count": 1})
    now = utcnow()
    running = apply(
        record,
        start_step(
            record, "reserve", instance="o-1:1", now=now - 20 * S, timeout=S, allowance=3
        ).changes,
    )
    policy = RecoveryPolicy(2, lambda n: n * S, compensate_at_limit=lambda r: True)
    error = ErrorInfo(kind=ErrorKind.TRANSIENT, message="inventory.reserve: HTTP 503", at=now)
    for update in (
        recover(running, now=now, policy=policy),
        release(
            running,
            "reserve",
            instance="o-1:1",
            now=now,
            error=error,
            attempts_used=3,
            policy=policy,
        ),
    ):
        after = apply(running, update.changes)
        assert after.process_state is ProcessState.COMPENSATING
        assert after.locked_by is None and after.complete_by is None
        assert after.next_attempt_at == now, "due at once for a compensator to claim"
        assert after.failure_count == 0, "the compensation counts its own recoveries"
        assert after.error is not None and after.error.kind is ErrorKind.RECOVERY_LIMIT
    below = running.model_copy(update={"failure_count": 0})
    assert apply(below, recover(below, now=now, policy=policy).changes).process_state is (
        ProcessState.PENDING
    )
