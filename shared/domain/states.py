"""Process states and step statuses (DESIGN §3)."""

from __future__ import annotations

from enum import StrEnum


class ProcessState(StrEnum):
    """Where an order stands in its lifecycle."""

    PENDING = "Pending"
    """Recorded and waiting to be claimed by a scheduler (also after a recovery)."""
    PROCESSING = "Processing"
    """Claimed by one attempt (`locked_by`), running its steps."""
    PROCESSED = "Processed"
    """Every step completed. Terminal."""
    ERROR = "Error"
    """Stopped for an operator: a non-transient failure, a spent budget, or too many recoveries."""
    COMPENSATING = "Compensating"
    """Undoing the completed steps in reverse order from the compensation log."""
    COMPENSATED = "Compensated"
    """Every completed step has been undone. Terminal."""
    COMPENSATION_FAILED = "CompensationFailed"
    """An undo still failed after its retries; an operator may compensate again."""
    CANCELLED = "Cancelled"
    """Cancelled by its customer before any step was sent: nothing to undo. Terminal. (An order
    cancelled later is compensated, and ends Compensated with the cancellation as its error.)"""

    @property
    def is_terminal(self) -> bool:
        return self in TERMINAL_STATES

    @property
    def needs_operator(self) -> bool:
        return self in FAILED_STATES


TERMINAL_STATES = frozenset(
    {ProcessState.PROCESSED, ProcessState.COMPENSATED, ProcessState.CANCELLED}
)
"""States no actor ever leaves."""

SETTLED_STATES = frozenset(
    {
        ProcessState.PROCESSED,
        ProcessState.COMPENSATED,
        ProcessState.CANCELLED,
        ProcessState.ERROR,
        ProcessState.COMPENSATION_FAILED,
    }
)
"""States in which no process will act on its own: finished, or waiting for an operator."""

LIVE_STATES = frozenset({ProcessState.PROCESSING, ProcessState.COMPENSATING})
"""States an attempt holds (`locked_by`, `complete_by`): the supervisor recovers an order left in
one past its deadline, and a settled order never holds an attempt."""

FAILED_STATES = frozenset({ProcessState.ERROR, ProcessState.COMPENSATION_FAILED})
"""States stopped for an operator: the failures operators list and group by default."""


class StepStatus(StrEnum):
    """Where one step of an order's workflow stands."""

    NOT_STARTED = "NotStarted"
    """Never sent to its agent by any attempt."""
    RUNNING = "Running"
    """Sent to its agent; the reply is awaited until `complete_by`."""
    COMPLETED = "Completed"
    """Done with a result: a checkpoint no later attempt runs again."""
    FAILED = "Failed"
    """Failed non-transiently, or its retry budget was spent."""
    COMPENSATED = "Compensated"
    """Completed, then undone by compensation."""


class ErrorKind(StrEnum):
    """Why an order or a step stopped; operators group failures by it."""

    TRANSIENT = "transient"
    """A failure that may go away (a timeout, an unavailable remote service)."""
    PERMANENT = "permanent"
    """A business failure the remote service will repeat (e.g. a declined card)."""
    DEADLINE = "deadline"
    """No reply before `complete_by`."""
    BUDGET_EXHAUSTED = "budget-exhausted"
    """The order's end-to-end retry budget is spent."""
    RECOVERY_LIMIT = "recovery-limit"
    """The supervisor recovered it as many times as allowed."""
    CONFLICT = "conflict"
    """A resubmission of the order id carried different order data."""
    UNKNOWN_WORKFLOW = "unknown-workflow"
    """The state record names a workflow or version this build does not know."""
    COMPENSATION = "compensation"
    """An undo failed after its retries."""
    CANCELLED = "cancelled"
    """Its customer cancelled it (the error of an order compensated because of that)."""
