"""Conditional updates of the operator's actions: resubmitting an order in Error, asking for one to
be compensated. Each expects the record as the operator saw it, so an order that changed since
it was selected is refused, not overwritten."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from shared.domain.models import RetryBudget, StateRecord, StepState
from shared.domain.states import ProcessState, StepStatus
from shared.domain.transitions import Action, check_transition
from shared.domain.updates import Changes, Expect, Update
from shared.domain.workflow import Workflow


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
