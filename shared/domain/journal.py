"""Records beside the state record: history, compensation log, alerts (DESIGN §3)."""

from __future__ import annotations

import hashlib
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationInfo,
)

from shared.domain.redaction import redact_shown
from shared.domain.text import clean_cut, is_stored, printable

JOURNAL_SCHEMA_VERSION = 1
"""Version of the history, compensation-log and alert record layout written by this build."""


def _escaped(value: Any) -> Any:
    if isinstance(value, str):
        return printable(value)
    if isinstance(value, dict):
        return {printable(str(k)): _escaped(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_escaped(v) for v in value]
    return value


def _clean_data(value: Any, info: ValidationInfo) -> Any:
    """Strings in free-form journal data escaped (shared/domain/text.py): they often quote
    errors and received values, and must neither make a write fail nor reach a screen raw.
    Not masked: they are the system's own values too (fingerprints, references), read back;
    what shows them masks the card numbers they quote (shared/domain/redaction.py)."""
    return value if is_stored(info) else _escaped(value)


JournalData = Annotated[dict[str, Any], BeforeValidator(_clean_data)]

ALERT_ID_LIMIT = 128


def _bounded_id(value: Any, info: ValidationInfo) -> Any:
    """An alert id with its card numbers masked by their stable marks and escaped, and over
    the limit keeps its start and ends in a digest of the whole (as masked: a digest of a card
    number could be searched for), so it still names one condition (ids are built from
    message ids, which senders choose)."""
    if is_stored(info) or not isinstance(value, str):
        return value
    masked = redact_shown(value)
    shown = printable(masked)
    if len(shown) <= ALERT_ID_LIMIT:
        return shown
    digest = hashlib.sha256(masked.encode("utf-8", "surrogatepass")).hexdigest()[:24]
    return f"{shown[: ALERT_ID_LIMIT - 25]}~{digest}"


class _Record(BaseModel):
    model_config = ConfigDict(strict=True, frozen=True, extra="forbid")


class HistoryEventType(StrEnum):
    """The task hub's timeline of one order."""

    ORDER_SUBMITTED = "OrderSubmitted"
    EXECUTION_STARTED = "ExecutionStarted"
    STEP_SCHEDULED = "StepScheduled"
    STEP_COMPLETED = "StepCompleted"
    STEP_FAILED = "StepFailed"
    DEADLINE_EXPIRED = "DeadlineExpired"
    RECOVERED = "Recovered"
    LEASE_LOST = "LeaseLost"
    EXECUTION_COMPLETED = "ExecutionCompleted"
    ERROR_RAISED = "ErrorRaised"
    COMPENSATION_STARTED = "CompensationStarted"
    COMPENSATION_STEP_DONE = "CompensationStepDone"
    COMPENSATION_COMPLETED = "CompensationCompleted"
    COMPENSATION_FAILED = "CompensationFailed"
    RESUBMITTED = "Resubmitted"
    CANCELLED = "Cancelled"


class HistoryEvent(_Record):
    order_id: str
    type: HistoryEventType
    at: datetime
    attempt: int | None = None
    instance_id: str | None = None
    step: str | None = None
    data: JournalData = Field(default_factory=dict)
    seq: int | None = None
    """Assigned by the store: the position in the timeline."""
    schema_version: int = JOURNAL_SCHEMA_VERSION


class UndoStatus(StrEnum):
    PENDING = "Pending"
    """Recorded when its step completed; not undone yet."""
    DONE = "Done"
    """Undone; its idempotency key makes a repeat harmless."""
    FAILED = "Failed"
    """The last try of the undo failed; a later compensation tries again."""


class CompensationEntry(_Record):
    """One completed step's undo, appended when the step completes; undone in reverse order."""

    order_id: str
    step: str
    undo: str
    """The remote operation that undoes the step, e.g. `inventory.release`."""
    idempotency_key: str
    recorded_at: datetime
    status: UndoStatus = UndoStatus.PENDING
    done_at: datetime | None = None
    error: Annotated[str, BeforeValidator(clean_cut(2000))] | None = None
    seq: int | None = None
    schema_version: int = JOURNAL_SCHEMA_VERSION


class AlertKind(StrEnum):
    ORDER_ERROR = "order-error"
    COMPENSATION_FAILED = "compensation-failed"
    DUAL_WRITE_CONFLICT = "dual-write-conflict"
    POISON_MESSAGE = "poison-message"
    CIRCUIT_OPEN = "circuit-open"
    BACKLOG_OVER_THRESHOLD = "backlog-over-threshold"
    STUCK_PENDING = "stuck-pending"
    NO_LEADER = "no-leader"
    BUDGET_EXHAUSTED = "budget-exhausted"
    """An order spent its retry budget and is being compensated (parked ones raise order-error)."""


class Severity(StrEnum):
    WARNING = "warning"
    CRITICAL = "critical"


class Alert(_Record):
    """A condition an operator must act on. Stored, and published on `<hub>.alerts`."""

    alert_id: Annotated[
        str,
        BeforeValidator(_bounded_id),
        StringConstraints(min_length=1, max_length=ALERT_ID_LIMIT),
    ]
    kind: AlertKind
    severity: Severity
    message: Annotated[str, BeforeValidator(clean_cut(2000)), StringConstraints(max_length=2000)]
    at: datetime
    order_id: Annotated[str, BeforeValidator(clean_cut(200))] | None = None
    source: Annotated[str, BeforeValidator(clean_cut(200))] | None = None
    """The process that raised it."""
    data: JournalData = Field(default_factory=dict)
    schema_version: int = JOURNAL_SCHEMA_VERSION


class AlertAction(StrEnum):
    """What an operator does with an alert (`orderflow alerts ack|resolve`)."""

    ACKNOWLEDGE = "acknowledge"
    """Someone is on it: pagers stop escalating."""
    RESOLVE = "resolve"
    """The condition is over: pagers close the incident."""


class AlertState(_Record):
    """Who acknowledged and resolved an alert, and when (None: not yet). Kept beside the alert,
    not in it: an alert is the message its raiser published, and never changes."""

    alert_id: str
    acknowledged_at: datetime | None = None
    acknowledged_by: str | None = None
    resolved_at: datetime | None = None
    resolved_by: str | None = None

    def at(self, action: AlertAction) -> datetime | None:
        """When `action` was recorded (None: not yet)."""
        return self.acknowledged_at if action is AlertAction.ACKNOWLEDGE else self.resolved_at

    def by(self, action: AlertAction) -> str | None:
        return self.acknowledged_by if action is AlertAction.ACKNOWLEDGE else self.resolved_by

    @property
    def changed_at(self) -> datetime | None:
        """When the alert was last acknowledged or resolved (None: never)."""
        times = [t for t in (self.acknowledged_at, self.resolved_at) if t is not None]
        return max(times, default=None)

    def with_action(self, action: AlertAction, *, by: str, at: datetime) -> AlertState:
        """This state with `action` recorded, unless it was already (the first record stands:
        acknowledging twice keeps who acknowledged first)."""
        if self.at(action) is not None:
            return self
        if action is AlertAction.ACKNOWLEDGE:
            return self.model_copy(update={"acknowledged_at": at, "acknowledged_by": by})
        return self.model_copy(update={"resolved_at": at, "resolved_by": by})
