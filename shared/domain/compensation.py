"""Conditional updates of compensation and of the operator's actions (DESIGN §3-4).

Compensation undoes the steps recorded in the compensation log, newest first. Its writes are
fenced by `locked_by` like a forward attempt's; the log itself records each undo's outcome.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from shared.domain.models import ErrorInfo, RetryBudget, StateRecord, StepState
from shared.domain.states import ErrorKind, ProcessState, StepStatus
from shared.domain.timing import deadline
from shared.domain.transitions import Action, check_transition
from shared.domain.updates import Changes, Expect, RecoveryPolicy, Update
from shared.domain.workflow import Workflow

COMPENSATING = frozenset({ProcessState.COMPENSATING})


def _fenced(instance: str) -> Expect:
    return Expect(process_state=COMPENSATING, locked_by=instance)


def start_undo(
    record: StateRecord, step: str, *, instance: str, now: datetime, timeout: timedelta
) -> Update:
    """A fresh deadline for one undo request."""
    check_transition(Action.RECORD_UNDO, record.process_state, ProcessState.COMPENSATING)
    return Update(
        _fenced(instance),
        Changes(fields={"complete_by": deadline(now, timeout), "updated_at": now}),
    )


def record_undo(record: StateRecord, step: str, *, instance: str, now: datetime) -> Update:
    """The step's effect is undone (or there was none to undo)."""
    check_transition(Action.RECORD_UNDO, record.process_state, ProcessState.COMPENSATING)
    undone = record.steps[step].model_copy(update={"status": StepStatus.COMPENSATED})
    return Update(_fenced(instance), Changes(fields={"updated_at": now}, steps={step: undone}))


def finish_compensation(
    record: StateRecord, *, instance: str, now: datetime, failure: ErrorInfo | None
) -> Update:
    """Compensated, or CompensationFailed (an undo failed after its retries)."""
    target = ProcessState.COMPENSATED if failure is None else ProcessState.COMPENSATION_FAILED
    check_transition(Action.FINISH_COMPENSATION, record.process_state, target)
    fields: dict[str, Any] = {
        "process_state": target,
        "locked_by": None,
        "complete_by": None,
        "updated_at": now,
    }
    if failure is not None:
        fields["error"] = failure
    return Update(_fenced(instance), Changes(fields=fields))


def recover_compensation(record: StateRecord, *, now: datetime, policy: RecoveryPolicy) -> Update:
    """Release a compensation attempt whose deadline passed (its compensator died)."""
    if record.complete_by is None or record.complete_by > now:
        raise ValueError("only an expired attempt can be recovered")
    failures = record.failure_count + 1
    parked = failures >= policy.failure_threshold
    target = ProcessState.COMPENSATION_FAILED if parked else ProcessState.COMPENSATING
    check_transition(Action.RECOVER_COMPENSATION, record.process_state, target)
    fields: dict[str, Any] = {
        "process_state": target,
        "locked_by": None,
        "complete_by": None,
        "failure_count": failures,
        "updated_at": now,
    }
    if parked:
        fields["error"] = ErrorInfo(
            kind=ErrorKind.COMPENSATION,
            at=now,
            message=f"compensation recovered {failures} times without finishing",
        )
    else:
        fields["next_attempt_at"] = now + policy.backoff(failures)
    expect = Expect(
        process_state=COMPENSATING,
        locked_by=record.locked_by,
        complete_by=record.complete_by,
        updated_at=record.updated_at,
    )
    return Update(expect, Changes(fields=fields))


def resubmit(
    record: StateRecord,
    workflow: Workflow,
    *,
    now: datetime,
    from_step: str | None = None,
    reset_failures: bool = True,
    seen_updated_at: datetime | None = None,
) -> Update:
    """An operator sends an order in Error back to Pending with a fresh retry budget.

    Steps from `from_step` on (default: the first not Completed) start over; a repeated request
    of a step that had an effect gets its first outcome back from the remote service (same
    idempotency key), so no effect is ever made twice. Expects the record as the operator saw
    it: last changed at `seen_updated_at` (default: `record`'s own), so an order that changed
    since it was selected is refused, not overwritten.
    """
    check_transition(Action.RESUBMIT, record.process_state, ProcessState.PENDING)
    names = [s.name for s in workflow.steps]
    if from_step is not None and from_step not in names:
        raise ValueError(f"no step {from_step!r} in {workflow.name}; steps: {', '.join(names)}")
    start = names.index(from_step) if from_step else 0
    steps = {
        name: StepState(attempts=record.steps[name].attempts)
        for name in names[start:]
        if from_step or record.steps[name].status is not StepStatus.COMPLETED
    }
    fields: dict[str, Any] = {
        "process_state": ProcessState.PENDING,
        "locked_by": None,
        "complete_by": None,
        "next_attempt_at": now,
        "error": None,
        "updated_at": now,
        "retry_budget": RetryBudget(limit=record.retry_budget.limit),
    }
    if reset_failures:
        fields["failure_count"] = 0
    expect = Expect(
        process_state=frozenset({ProcessState.ERROR}),
        updated_at=record.updated_at if seen_updated_at is None else seen_updated_at,
    )
    return Update(expect, Changes(fields=fields, steps=steps))


def request_compensation(
    record: StateRecord, *, now: datetime, seen_updated_at: datetime | None = None
) -> Update:
    """An operator asks for an order in Error or CompensationFailed to be compensated.

    Expects the record as the operator saw it (see `resubmit`)."""
    check_transition(Action.COMPENSATE, record.process_state, ProcessState.COMPENSATING)
    fields: dict[str, Any] = {
        "process_state": ProcessState.COMPENSATING,
        "locked_by": None,
        "complete_by": None,
        "next_attempt_at": now,
        "failure_count": 0,
        "updated_at": now,
    }
    expect = Expect(
        process_state=frozenset({record.process_state}),
        updated_at=record.updated_at if seen_updated_at is None else seen_updated_at,
    )
    return Update(expect, Changes(fields=fields))
