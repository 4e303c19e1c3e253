"""What the operator is told about orders: pure functions over records, unit-tested.

Where an order stands, what the system will do with it next and when, which failures share a
cause, and what an undo would do.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime

from services.operator.results import ErrorBrief, FailureGroupView, StepRow
from shared.config import SupervisorSettings
from shared.domain.durations import human_age
from shared.domain.journal import CompensationEntry, UndoStatus
from shared.domain.models import StateRecord
from shared.domain.states import LIVE_STATES, ProcessState, StepStatus
from shared.domain.workflow import get_workflow
from shared.store.port import StateQuery


def current_step(record: StateRecord) -> str | None:
    """The first step of the workflow that is not Completed: where the order is, or stopped."""
    workflow = get_workflow(record.workflow, record.workflow_version)
    names = [s.name for s in workflow.steps] if workflow is not None else list(record.steps)
    for name in names:
        state = record.steps.get(name)
        if state is not None and state.status is not StepStatus.COMPLETED:
            return name
    return None


def unselected_because(record: StateRecord, query: StateQuery, step: str | None) -> str | None:
    """Why the record no longer matches the query (and step) that selected it; None if it does.

    The store's `query_states` semantics, checked again when an operator's bulk action reaches
    the order: the selection may be minutes old by then (a paced resubmission)."""
    if query.states is not None and record.process_state not in query.states:
        wanted = " or ".join(sorted(s.value for s in query.states))
        return f"state {record.process_state.value}, not {wanted}"
    if query.error_kind is not None:
        kind = None if record.error is None else record.error.kind
        if kind is not query.error_kind:
            now = "no error" if kind is None else f"error kind {kind.value}"
            return f"{now}, not {query.error_kind.value}"
    if query.changed_before is not None and record.updated_at >= query.changed_before:
        return "changed more recently than --older-than allows"
    if step is not None and (at := current_step(record)) != step:
        return f"at step {at or '(none)'}, not {step}"
    return None


_VARIABLE = re.compile(
    r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"  # uuids
    r"|\b[0-9a-f]{12,}\b"  # long hex ids
    r"|\d{4}-\d{2}-\d{2}[T ][\d:.]+(?:[+-]\d{2}:\d{2}|Z)?"  # timestamps
    r"|\b(?:ord|o)-[A-Za-z0-9._-]+"  # order ids
    r"|\d+(?:\.\d+)?",  # numbers
    re.IGNORECASE,
)


def fingerprint(message: str) -> str:
    """The message with its variable parts (ids, numbers, times) replaced by `#`, so that
    failures with one cause group together."""
    return _VARIABLE.sub("#", message).strip()


@dataclass
class FailureGroup:
    kind: str
    fingerprint: str
    count: int = 0
    order_ids: list[str] = field(default_factory=list)
    states: dict[str, int] = field(default_factory=dict)
    oldest: datetime | None = None
    newest: datetime | None = None

    def add(self, record: StateRecord) -> None:
        self.count += 1
        if len(self.order_ids) < 5:
            self.order_ids.append(record.order_id)
        state = record.process_state.value
        self.states[state] = self.states.get(state, 0) + 1
        changed = record.updated_at
        self.oldest = changed if self.oldest is None else min(self.oldest, changed)
        self.newest = changed if self.newest is None else max(self.newest, changed)

    def view(self) -> FailureGroupView:
        return FailureGroupView(
            error_kind=self.kind,
            fingerprint=self.fingerprint,
            count=self.count,
            states=self.states,
            examples=self.order_ids,
            oldest_change=self.oldest.isoformat() if self.oldest else None,
            newest_change=self.newest.isoformat() if self.newest else None,
        )


def group_failures(records: list[StateRecord]) -> list[FailureGroup]:
    """Failed orders grouped by error kind and message fingerprint, biggest group first."""
    groups: dict[tuple[str, str], FailureGroup] = {}
    for record in records:
        if record.error is None:
            continue
        key = (record.error.kind.value, fingerprint(record.error.message))
        groups.setdefault(key, FailureGroup(*key)).add(record)
    return sorted(groups.values(), key=lambda g: (-g.count, g.kind, g.fingerprint))


def next_action(record: StateRecord, supervisor: SupervisorSettings, now: datetime) -> str:
    """What the system will do with this order next, and when; or what the operator can do."""
    state = record.process_state
    threshold = supervisor.failure_threshold
    oid = record.order_id
    if state is ProcessState.PENDING:
        if record.next_attempt_at <= now:
            return "waiting for a scheduler to claim it (due now)"
        wait = human_age(record.next_attempt_at, now)
        why = (
            f" (backing off after {record.failure_count} failure(s))"
            if record.failure_count
            else ""
        )
        return f"a scheduler may claim it {wait}{why}"
    if state in LIVE_STATES:
        work = "compensating" if state is ProcessState.COMPENSATING else "running"
        if record.locked_by is None:
            return "waiting for a scheduler to take the compensation over"
        failures = record.failure_count + 1
        then = "park it in " + (
            "CompensationFailed" if state is ProcessState.COMPENSATING else "Error"
        )
        if failures < threshold:
            then = f"release it for another attempt (failure {failures} of {threshold})"
        if record.complete_by is None:
            return f"attempt {record.attempt} is {work} with no deadline (audit will flag it)"
        if record.complete_by > now:
            return (
                f"attempt {record.attempt} ({record.owner or 'unknown scheduler'}) is {work}; "
                f"if it has not finished by its deadline ({human_age(record.complete_by, now)}) "
                f"the supervisor will {then}"
            )
        return (
            f"deadline passed {human_age(record.complete_by, now)}: the supervisor will {then} "
            f"on its next round (every {supervisor.supervisor_interval_s:g}s; "
            "if this stays, "
            "check that a supervisor runs: `orderflow stats`)"
        )
    if state is ProcessState.ERROR:
        return (
            f"parked for an operator: fix the cause, then `orderflow orders resubmit {oid}` "
            f"(or undo what it did: `orderflow orders compensate {oid}`)"
        )
    if state is ProcessState.COMPENSATION_FAILED:
        return f"an undo failed: fix the cause, then `orderflow orders compensate {oid}`"
    return "finished: nothing more will happen"


@dataclass(frozen=True)
class Undo:
    step: str
    operation: str
    idempotency_key: str
    status: UndoStatus
    will_run: bool


def undo_plan(log: list[CompensationEntry]) -> list[Undo]:
    """The undos a compensation runs, newest step first; those already Done are skipped."""
    return [
        Undo(
            step=entry.step,
            operation=entry.undo,
            idempotency_key=entry.idempotency_key,
            status=entry.status,
            will_run=entry.status is not UndoStatus.DONE,
        )
        for entry in reversed(log)
    ]


def step_rows(record: StateRecord) -> list[StepRow]:
    """The steps in workflow order, for `orders show`."""
    workflow = get_workflow(record.workflow, record.workflow_version)
    names = [s.name for s in workflow.steps] if workflow is not None else list(record.steps)
    rows = []
    for name in names:
        step = record.steps[name]
        took = (
            (step.completed_at - step.started_at).total_seconds()
            if step.completed_at is not None and step.started_at is not None
            else None
        )
        rows.append(
            StepRow(
                step=name,
                status=step.status.value,
                attempts=step.attempts,
                allowance=step.allowance,
                started_at=step.started_at.isoformat() if step.started_at else None,
                completed_at=step.completed_at.isoformat() if step.completed_at else None,
                seconds=took,
                error=None
                if step.error is None
                else ErrorBrief(kind=step.error.kind.value, message=step.error.message),
            )
        )
    return rows
