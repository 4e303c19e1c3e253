"""Compensation and operator updates: what they expect and what they set."""

from __future__ import annotations

from datetime import timedelta

import pytest

from shared.domain.compensation import (
    finish_compensation,
    record_undo,
    recover_compensation,
    start_undo,
)
from shared.domain.models import ErrorInfo, RetryBudget
from shared.domain.operator_actions import request_compensation, resubmit
from shared.domain.states import ErrorKind, ProcessState, StepStatus
from shared.domain.timing import utcnow
from shared.domain.updates import RecoveryPolicy, apply, matches
from shared.domain.workflow import ORDER_WORKFLOW
from shared.errors import IllegalTransition
from tests.support.factories import order_pair

S = timedelta(seconds=1)


def record(state: ProcessState, **fields):
    _, r = order_pair("o-1")
    return r.model_copy(update={"process_state": state, **fields})


def test_an_undo_is_fenced_and_marks_the_step_compensated() -> None:
    r = record(ProcessState.COMPENSATING, locked_by="o-1:2", attempt=2)
    now = utcnow()
    started = start_undo(r, "reserve", instance="o-1:2", now=now, timeout=3 * S)
    assert started.expect.locked_by == "o-1:2"
    assert apply(r, started.changes).complete_by == now + 3 * S
    done = apply(r, record_undo(r, "reserve", instance="o-1:2", now=now).changes)
    assert done.steps["reserve"].status is StepStatus.COMPENSATED


@pytest.mark.parametrize("failed", [False, True])
def test_finishing_compensation_unlocks_into_a_distinct_outcome(failed: bool) -> None:
    r = record(ProcessState.COMPENSATING, locked_by="o-1:2")
    err = ErrorInfo(kind=ErrorKind.COMPENSATION, message="undo failed", at=utcnow())
    after = apply(
        r,
        finish_compensation(
            r, instance="o-1:2", now=utcnow(), failure=err if failed else None
        ).changes,
    )
    expected = ProcessState.COMPENSATION_FAILED if failed else ProcessState.COMPENSATED
    assert (after.process_state, after.locked_by) == (expected, None)
    assert (after.error == err) is failed


def test_an_expired_compensation_is_released_then_parked_at_the_threshold() -> None:
    policy = RecoveryPolicy(failure_threshold=2, backoff=lambda n: n * S)
    now = utcnow()
    r = record(ProcessState.COMPENSATING, locked_by="o-1:2", complete_by=now - S)
    u = recover_compensation(r, now=now, policy=policy)
    assert (u.expect.locked_by, u.expect.complete_by) == ("o-1:2", now - S)
    released = apply(r, u.changes)
    assert (released.process_state, released.locked_by) == (ProcessState.COMPENSATING, None)
    assert released.next_attempt_at == now + S
    again = released.model_copy(update={"locked_by": "o-1:3", "complete_by": now - S})
    parked = apply(again, recover_compensation(again, now=now, policy=policy).changes)
    assert parked.process_state is ProcessState.COMPENSATION_FAILED
    assert parked.error.kind is ErrorKind.COMPENSATION


def test_resubmit_resets_what_did_not_complete_and_grants_a_fresh_budget() -> None:
    r = record(
        ProcessState.ERROR,
        failure_count=4,
        retry_budget=RetryBudget(limit=9, used=9),
        error=ErrorInfo(kind=ErrorKind.RECOVERY_LIMIT, message="x", at=utcnow()),
    )
    done = r.steps["reserve"].model_copy(update={"status": StepStatus.COMPLETED, "attempts": 2})
    failed = r.steps["charge"].model_copy(update={"status": StepStatus.FAILED, "attempts": 3})
    r = r.model_copy(update={"steps": {**r.steps, "reserve": done, "charge": failed}})
    now = utcnow()
    u = resubmit(r, ORDER_WORKFLOW, now=now)
    assert u.expect.updated_at == r.updated_at
    after = apply(r, u.changes)
    assert (after.process_state, after.failure_count, after.error) == (
        ProcessState.PENDING,
        0,
        None,
    )
    assert after.retry_budget == RetryBudget(limit=9)
    assert after.steps["reserve"].status is StepStatus.COMPLETED
    assert (after.steps["charge"].status, after.steps["charge"].attempts) == (
        StepStatus.NOT_STARTED,
        3,
    )
    from_reserve = apply(r, resubmit(r, ORDER_WORKFLOW, now=now, from_step="reserve").changes)
    assert from_reserve.steps["reserve"].status is StepStatus.NOT_STARTED
    with pytest.raises(ValueError):
        resubmit(r, ORDER_WORKFLOW, now=now, from_step="nope")


def test_only_error_is_resubmitted_and_error_or_compensation_failed_compensated() -> None:
    with pytest.raises(IllegalTransition):
        resubmit(record(ProcessState.COMPENSATION_FAILED), ORDER_WORKFLOW, now=utcnow())
    for state in (ProcessState.ERROR, ProcessState.COMPENSATION_FAILED):
        r = record(state)
        after = apply(r, request_compensation(r, now=utcnow()).changes)
        assert (after.process_state, after.locked_by) == (ProcessState.COMPENSATING, None)
    with pytest.raises(IllegalTransition):
        request_compensation(record(ProcessState.PROCESSED), now=utcnow())


def test_the_order_workflow_compensates_declines_and_parks_outages() -> None:
    assert ORDER_WORKFLOW.compensates(ErrorKind.PERMANENT)
    assert not ORDER_WORKFLOW.compensates(ErrorKind.RECOVERY_LIMIT)
    assert not ORDER_WORKFLOW.compensates(ErrorKind.BUDGET_EXHAUSTED)
    assert ORDER_WORKFLOW.compensates(
        ErrorKind.BUDGET_EXHAUSTED, frozenset({ErrorKind.BUDGET_EXHAUSTED})
    )


def test_operator_updates_expect_the_record_as_it_was_selected() -> None:
    """A bulk action expects the `updated_at` of its selection, not of a later read, so an order
    that changed in between is refused by the store; named orders expect the record as read."""
    r = record(ProcessState.ERROR)
    selected = r.updated_at - S
    now = utcnow()
    assert resubmit(r, ORDER_WORKFLOW, now=now, seen_updated_at=selected).expect.updated_at == (
        selected
    )
    assert request_compensation(r, now=now, seen_updated_at=selected).expect.updated_at == (
        selected
    )
    assert request_compensation(r, now=now).expect.updated_at == r.updated_at
    assert not matches(r, resubmit(r, ORDER_WORKFLOW, now=now, seen_updated_at=selected).expect)
    assert matches(r, resubmit(r, ORDER_WORKFLOW, now=now).expect)
