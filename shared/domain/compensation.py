"""Conditional updates of compensation (DESIGN §3-4); the operator's are in `operator_actions`.

Compensation undoes the steps recorded in the compensation log, newest first. Its writes are
fenced by `locked_by` like a forward attempt's; the log itself records each undo's outcome.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from shared.domain.models import ErrorInfo, StateRecord
from shared.domain.states import ErrorKind, ProcessState, StepStatus
from shared.domain.timing import deadline
from shared.domain.transitions import Action, check_transition
from shared.domain.updates import Changes, Expect, RecoveryPolicy, Update

COMPENSATING = frozenset({ProcessState.COMPENSATING})


def _fenced(instance: str) -> Expect:
    return Expect(process_state=COMPENSATING, locked_by=instance)


def record_undo(
    record: StateRecord,
    step: str,
    *,
    instance: str,
    now: datetime,
    request_timeout: timedelta | None = None,
) -> Update:
    """Record one undo (the row `record-undo`): its request going out, with `request_timeout`
    (a fresh deadline for the request), or its outcome, without (the step's effect is undone,
    or there was none to undo)."""
    check_transition(Action.RECORD_UNDO, record.process_state, ProcessState.COMPENSATING)
    if request_timeout is not None:
        fields = {"complete_by": deadline(now, request_timeout), "updated_at": now}
        return Update(_fenced(instance), Changes(fields=fields))
    undone = record.steps[step].model_copy(update={"status": StepStatus.COMPENSATED})
    return Update(_fenced(instance), Changes(fields={"updated_at": now}, steps={step: undone}))


def start_undo(
    record: StateRecord, step: str, *, instance: str, now: datetime, timeout: timedelta
) -> Update:
    """`record_undo` of an undo's request: a fresh deadline for it (the compensator's name)."""
    return record_undo(record, step, instance=instance, now=now, request_timeout=timeout)


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
