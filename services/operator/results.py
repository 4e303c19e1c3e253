"""What the operator's actions answer, as typed values: the API's response models and what the
commands print (their `--json` is the same value).

Times are ISO 8601 text as `datetime.isoformat` writes them (`+00:00`, not pydantic's `Z`), so
that the answers stay as they were when they were dictionaries; field order is the order they
are printed in.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel

from shared.domain.journal import Alert, AlertState
from shared.domain.models import STORED


class ErrorBrief(BaseModel):
    kind: str
    message: str


class ErrorAt(ErrorBrief):
    at: str


class OrderSummary(BaseModel):
    """An order's line in a listing."""

    order_id: str
    state: str
    step: str | None
    attempt: int
    failures: int
    error: ErrorBrief | None
    updated_at: str
    cursor: str
    """Where a listing continues after this order (`cursor`, `--after`)."""


class OrderList(BaseModel):
    orders: list[OrderSummary]
    next: str | None
    """The cursor of the next page (None: no more)."""


class FailureGroupView(BaseModel):
    """Failed orders sharing an error kind and a message fingerprint."""

    error_kind: str
    fingerprint: str
    count: int
    states: dict[str, int]
    examples: list[str]
    """Up to five of its orders."""
    oldest_change: str | None
    newest_change: str | None


class FailureGroups(BaseModel):
    groups: list[FailureGroupView]
    """Biggest group first."""


class RetryBudget(BaseModel):
    limit: int
    used: int
    remaining: int


class StepRow(BaseModel):
    step: str
    status: str
    attempts: int
    allowance: int
    started_at: str | None
    completed_at: str | None
    seconds: float | None
    error: ErrorBrief | None


class StateView(BaseModel):
    process_state: str
    workflow: str
    attempt: int
    locked_by: str | None
    owner: str | None
    complete_by: str | None
    next_attempt_at: str
    failure_count: int
    failure_threshold: int
    retry_budget: RetryBudget
    reply_to: str | None
    error: ErrorAt | None
    created_at: str
    updated_at: str
    steps: list[StepRow]
    next: str
    """What happens next, and when; or what the operator can do."""


class UndoRow(BaseModel):
    step: str
    undo: str
    idempotency_key: str
    status: str


class OrderView(BaseModel):
    """An order: its data (the payment token by its start only), state, steps, retry budget,
    lease, undo log and what happens next."""

    order_id: str
    order: dict[str, Any] | None
    received_at: str | None
    state: StateView | None
    compensation: list[UndoRow]


class TimelineEvent(BaseModel):
    at: str
    since_start_s: float
    since_previous_s: float
    event: str
    attempt: int | None
    instance_id: str | None
    step: str | None
    data: dict[str, Any]


class History(BaseModel):
    events: list[TimelineEvent]


class ProcessRow(BaseModel):
    name: str
    kind: str
    seen: str
    data: dict[str, Any]


class Processes(BaseModel):
    """The processes reporting, their open circuit breakers and intake, the leader."""

    processes: list[ProcessRow]
    open_breakers: list[str]
    leader: str | None
    intake: list[dict[str, Any]]


class Stats(BaseModel):
    """One snapshot of a hub across the store and the broker (`stats`, `watch`)."""

    hub: str
    at: str
    by_state: dict[str, int]
    stuck_pending: list[str]
    stuck_pending_capped: bool
    overdue: list[str]
    overdue_capped: bool
    count_cap: int
    processes: list[ProcessRow]
    open_breakers: list[str]
    leader: str | None
    intake: list[dict[str, Any]]
    queues: dict[str, int | None]
    """Messages in each input, dead-letter and retry queue; None: not declared."""


class DeadLetter(BaseModel):
    """A dead letter of an input queue: why, when, how often it was delivered. Its header
    values are as JSON can hold them, whoever wrote them (shared/broker/dead_letters.py)."""

    queue: str
    message_id: str | None
    type: str | None
    reason: Any
    error: Any
    dead_lettered_at: Any
    age: str
    deliveries: Any
    source_queue: Any
    bytes: int


class ShownDeadLetter(DeadLetter):
    """A dead letter in full: with its headers and its body (payment tokens shortened)."""

    headers: dict[str, Any]
    body: str


class DeadLetters(BaseModel):
    messages: list[DeadLetter]


class ShownDeadLetters(BaseModel):
    messages: list[ShownDeadLetter]
    """One, or more when DLQs hold copies of it."""


class UndeliveredAlert(DeadLetter):
    """A notice the notifier could not deliver, with the target it was for."""

    target: Any


class ReplayResult(BaseModel):
    replayed: list[dict[str, Any]]
    unsealed: list[dict[str, Any]]
    not_found: list[str]


class Purged(BaseModel):
    purged: dict[str, int]
    """Messages deleted, per dead-letter queue."""


class AlertRow(Alert):
    """A stored alert with who acknowledged and resolved it, and when (None: not yet)."""

    acknowledged_at: datetime | None = None
    acknowledged_by: str | None = None
    resolved_at: datetime | None = None
    resolved_by: str | None = None


def alert_row(alert: Alert, state: AlertState) -> AlertRow:
    """The alert as it was read, its text not cleaned a second time (read as stored: cleaning
    what was accepted would escape it twice); shown escaped by each view."""
    fields = alert.model_dump() | state.model_dump(exclude={"alert_id"})
    return AlertRow.model_validate(fields, context=STORED)


class AlertList(BaseModel):
    alerts: list[AlertRow]
