"""Conditional updates as values: what a state change expects, and what it sets.

Each function here turns one row of the transition table into an `Update` for the store port;
`matches` and `apply` give the exact semantics every store adapter must reproduce (the contract
suite checks that they do).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import Enum
from typing import Any, Literal

from shared.domain.models import (
    MUTABLE_STATE_FIELDS,
    ErrorInfo,
    RetryBudget,
    StateRecord,
    StepState,
)
from shared.domain.states import LIVE_STATES, ErrorKind, ProcessState, StepStatus
from shared.domain.timing import deadline
from shared.domain.transitions import Action, check_transition
from shared.domain.workflow import Workflow


class _Any(Enum):
    ANY = "any"


ANY: Literal[_Any.ANY] = _Any.ANY
"""In an `Expect`, a field whose current value does not matter."""


@dataclass(frozen=True)
class Expect:
    """The condition of a conditional update: what the record must still look like."""

    process_state: frozenset[ProcessState] | Literal[_Any.ANY] = ANY
    locked_by: str | Literal[_Any.ANY] | None = ANY
    complete_by: datetime | Literal[_Any.ANY] | None = ANY
    updated_at: datetime | Literal[_Any.ANY] = ANY
    due_by: datetime | Literal[_Any.ANY] = ANY
    """The record's `next_attempt_at` is at or before this (a claim takes only due records)."""


@dataclass(frozen=True)
class Changes:
    """What a matching update sets: whole top-level fields and whole steps."""

    fields: Mapping[str, Any] = field(default_factory=dict)
    steps: Mapping[str, StepState] = field(default_factory=dict)

    def __post_init__(self) -> None:
        unknown = set(self.fields) - MUTABLE_STATE_FIELDS - {"steps"}
        if unknown or "steps" in self.fields:
            raise ValueError(f"not a settable state field: {sorted(unknown | {'steps'})}")


@dataclass(frozen=True)
class Update:
    expect: Expect
    changes: Changes


def matches(record: StateRecord, expect: Expect) -> bool:
    if expect.process_state is not ANY and record.process_state not in expect.process_state:
        return False
    if expect.locked_by is not ANY and record.locked_by != expect.locked_by:
        return False
    if expect.complete_by is not ANY and record.complete_by != expect.complete_by:
        return False
    if expect.due_by is not ANY and record.next_attempt_at > expect.due_by:
        return False
    return expect.updated_at is ANY or record.updated_at == expect.updated_at


def apply(record: StateRecord, changes: Changes) -> StateRecord:
    steps = {**record.steps, **changes.steps}
    return record.model_copy(update={**changes.fields, "steps": steps})


def chain(first: Update, second: Update, *, after_first: StateRecord) -> Update:
    """Two updates of one attempt as one: `first`, then `second`, which was built for the record
    as `first` leaves it (`after_first`). The result expects what `first` expects and sets what
    both set (the second wins where both set a field), so the store applies both or neither.
    Refused when the second would not match after the first (a different attempt's write)."""
    if not matches(after_first, second.expect):
        raise ValueError("the second update would not match the record the first one leaves")
    return Update(
        first.expect,
        Changes(
            fields={**first.changes.fields, **second.changes.fields},
            steps={**first.changes.steps, **second.changes.steps},
        ),
    )


def _fenced(instance: str) -> Expect:
    return Expect(process_state=frozenset({ProcessState.PROCESSING}), locked_by=instance)


def start_step(
    record: StateRecord,
    step: str,
    *,
    instance: str,
    now: datetime,
    timeout: timedelta,
    allowance: int,
) -> Update:
    """Mark a step Running with a fresh deadline and reserve its attempts from the budget."""
    check_transition(Action.START_STEP, record.process_state, ProcessState.PROCESSING)
    if allowance < 1 or allowance > record.retry_budget.remaining:
        raise ValueError(f"allowance {allowance} outside 1..{record.retry_budget.remaining}")
    current = record.steps[step]
    if current.status is StepStatus.COMPLETED:
        raise ValueError(f"step {step} is a checkpoint: it never runs again")
    running = current.model_copy(
        update={
            "status": StepStatus.RUNNING,
            "attempts": current.attempts + 1,
            "allowance": allowance,
            "started_at": now,
            "error": None,
        }
    )
    return Update(
        _fenced(instance),
        Changes(
            fields={
                "complete_by": deadline(now, timeout),
                "retry_budget": record.retry_budget.spend(allowance),
                "updated_at": now,
            },
            steps={step: running},
        ),
    )


def extend_deadline(
    record: StateRecord, *, instance: str, now: datetime, timeout: timedelta
) -> Update:
    """Move a live attempt's deadline forward while it holds its order through an outage (its
    request could not be sent yet). Changes nothing else: no budget is spent, no state changes.
    Fenced like every write of the attempt, so a superseded attempt cannot extend anything."""
    if record.process_state not in LIVE_STATES:
        raise ValueError(f"no live attempt to extend: the order is {record.process_state}")
    return Update(
        Expect(process_state=LIVE_STATES, locked_by=instance),
        Changes(fields={"complete_by": deadline(now, timeout), "updated_at": now}),
    )


def _settle_budget(record: StateRecord, step: str, attempts_used: int) -> RetryBudget:
    """Give back the part of the reservation the agent did not spend."""
    reserved = record.steps[step].allowance
    used = record.retry_budget.used - reserved + min(attempts_used, reserved)
    return record.retry_budget.model_copy(update={"used": max(0, used)})


def complete_step(
    record: StateRecord,
    workflow: Workflow,
    step: str,
    *,
    instance: str,
    now: datetime,
    result: dict[str, Any],
    attempts_used: int,
) -> Update:
    """Record a step's result; after the last step the order is Processed and unlocked."""
    last = workflow.is_last(step)
    target = ProcessState.PROCESSED if last else ProcessState.PROCESSING
    check_transition(Action.COMPLETE_STEP, record.process_state, target)
    done = record.steps[step].model_copy(
        update={
            "status": StepStatus.COMPLETED,
            "allowance": 0,
            "completed_at": now,
            "result": result,
            "error": None,
        }
    )
    fields: dict[str, Any] = {
        "retry_budget": _settle_budget(record, step, attempts_used),
        "updated_at": now,
    }
    if last:
        fields |= {"process_state": target, "locked_by": None, "complete_by": None}
    return Update(_fenced(instance), Changes(fields=fields, steps={step: done}))


def fail(
    record: StateRecord,
    step: str,
    *,
    instance: str,
    now: datetime,
    error: ErrorInfo,
    attempts_used: int,
    compensate_within: timedelta | None,
) -> Update:
    """A non-transient failure or a spent budget: Error for an operator, or Compensating.

    With `compensate_within`, the attempt keeps its lock and goes on to compensate, with that
    long before the supervisor may take the compensation over."""
    target = ProcessState.ERROR if compensate_within is None else ProcessState.COMPENSATING
    check_transition(Action.FAIL, record.process_state, target)
    failed = record.steps[step].model_copy(
        update={"status": StepStatus.FAILED, "allowance": 0, "error": error}
    )
    fields: dict[str, Any] = {
        "process_state": target,
        "locked_by": None,
        "complete_by": None,
        "error": error,
        "retry_budget": _settle_budget(record, step, attempts_used),
        "updated_at": now,
    }
    if compensate_within is not None:
        del fields["locked_by"]
        fields["complete_by"] = deadline(now, compensate_within)
    return Update(_fenced(instance), Changes(fields=fields, steps={step: failed}))


@dataclass(frozen=True)
class RecoveryPolicy:
    failure_threshold: int
    backoff: Callable[[int], timedelta]
    """The wait, after `failure_count` failures, before the order may be claimed again."""
    compensate_at_limit: Callable[[StateRecord], bool] = lambda record: False
    """Whether an order at the failure threshold is compensated (its workflow compensates
    `recovery-limit`) rather than parked in Error."""


def _at_limit(
    record: StateRecord, failures: int, policy: RecoveryPolicy, last: str, now: datetime
) -> tuple[ProcessState, dict[str, Any]]:
    """Where an order goes after its `failures`-th recovery, and the fields that says."""
    if failures < policy.failure_threshold:
        return ProcessState.PENDING, {"next_attempt_at": now + policy.backoff(failures)}
    error = ErrorInfo(
        kind=ErrorKind.RECOVERY_LIMIT,
        message=f"recovered {failures} times without finishing (threshold "
        f"{policy.failure_threshold}); last: {last}"[:2000],
        at=now,
    )
    if not policy.compensate_at_limit(record):
        return ProcessState.ERROR, {"error": error}
    # Unlocked and due: a scheduler's compensator claims it, with a fresh failure count for the
    # compensation's own recoveries (as when an operator asks for it).
    return ProcessState.COMPENSATING, {"error": error, "next_attempt_at": now, "failure_count": 0}


def recover(record: StateRecord, *, now: datetime, policy: RecoveryPolicy) -> Update:
    """Release an attempt whose deadline passed, or park the order at the failure threshold.

    Expects exactly the `locked_by`, `complete_by` and `updated_at` the supervisor saw, so a
    step that was restarted or completed meanwhile, or a second supervisor that got there first,
    makes this match nothing. (`updated_at` matters: a reply that beat the deadline may be
    recorded just after it, after the scan read the record; without it, the recovery would
    reset the step that write had just completed.)
    """
    if record.complete_by is None or record.complete_by > now:
        raise ValueError("only an expired attempt can be recovered")
    failures = record.failure_count + 1
    timed_out = ErrorInfo(
        kind=ErrorKind.DEADLINE, message=f"no reply by {record.complete_by.isoformat()}", at=now
    )
    target, outcome = _at_limit(record, failures, policy, timed_out.message, now)
    check_transition(Action.RECOVER, record.process_state, target)
    steps = {
        name: state.model_copy(
            update={"status": StepStatus.NOT_STARTED, "allowance": 0, "error": timed_out}
        )
        for name, state in record.steps.items()
        if state.status is StepStatus.RUNNING
    }
    fields: dict[str, Any] = {
        "process_state": target,
        "locked_by": None,
        "complete_by": None,
        "failure_count": failures,
        "updated_at": now,
    } | outcome
    expect = Expect(
        process_state=frozenset({ProcessState.PROCESSING}),
        locked_by=record.locked_by,
        complete_by=record.complete_by,
        updated_at=record.updated_at,
    )
    return Update(expect, Changes(fields=fields, steps=steps))


def release(
    record: StateRecord,
    step: str,
    *,
    instance: str,
    now: datetime,
    error: ErrorInfo,
    attempts_used: int,
    policy: RecoveryPolicy,
) -> Update:
    """The attempt gives its order back: the step failed transiently after every attempt it was
    allowed (or its circuit is open). Like a recovery, without waiting for the deadline: the
    order is due again after the backoff, or parked in Error at the failure threshold. Fenced:
    only the live attempt can release its order."""
    failures = record.failure_count + 1
    target, outcome = _at_limit(record, failures, policy, error.message, now)
    check_transition(Action.RELEASE, record.process_state, target)
    failed = record.steps[step].model_copy(
        update={"status": StepStatus.NOT_STARTED, "allowance": 0, "error": error}
    )
    fields: dict[str, Any] = {
        "process_state": target,
        "locked_by": None,
        "complete_by": None,
        "failure_count": failures,
        "retry_budget": _settle_budget(record, step, attempts_used),
        "updated_at": now,
    } | outcome
    return Update(_fenced(instance), Changes(fields=fields, steps={step: failed}))
