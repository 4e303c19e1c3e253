"""The customer's cancellation of an order (DESIGN §4, the rows of `customer`).

An order none of whose steps was ever sent becomes Cancelled at once: nothing happened that
needs undoing. Any other unfinished order is compensated: it becomes Compensating, unlocked and
due, so a scheduler's compensator undoes what its steps did (the compensation log holds every
step that was sent, a step still running included: its undo commutes with its call,
decision:undo-commutes-with-call), and ends Compensated with the cancellation as its error. The
attempt running it
is fenced out by the same write: every write of that attempt expects Processing and its own
`locked_by`, and finds neither. A Processed order, or one already finished, compensated or
being compensated, refuses cancellation with the reason.

The update expects the record exactly as it was read (state, lock and last change), so a
cancellation never races a claim, a step or a recovery into a mixed record: when the order
changed meanwhile the update matches nothing, and the caller reads it again.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from shared.domain.models import ErrorInfo, StateRecord
from shared.domain.states import ErrorKind, ProcessState
from shared.domain.transitions import Action, check_transition
from shared.domain.updates import Changes, Expect, Update
from shared.errors import IllegalTransition

CANCELLABLE = frozenset({ProcessState.PENDING, ProcessState.PROCESSING, ProcessState.ERROR})

_REFUSALS = {
    ProcessState.PROCESSED: "it is Processed: every step is done, so there is nothing to cancel",
    ProcessState.CANCELLED: "it is Cancelled already",
    ProcessState.COMPENSATED: "it is Compensated already: every step it made was undone",
    ProcessState.COMPENSATING: "it is being compensated already",
    ProcessState.COMPENSATION_FAILED: (
        "its compensation failed and waits for an operator, who can compensate it again"
    ),
}


def refusal(record: StateRecord) -> str | None:
    """Why the order cannot be cancelled (None: it can)."""
    if record.process_state in CANCELLABLE:
        return None
    return _REFUSALS.get(record.process_state, f"it is {record.process_state}")


def nothing_sent(record: StateRecord) -> bool:
    """No request of any step ever went out: no effect can exist anywhere."""
    return all(step.attempts == 0 for step in record.steps.values())


def cancel(record: StateRecord, *, now: datetime, by: str) -> Update:
    """Cancel the order as read: at once when nothing was sent, else by compensation."""
    if (why := refusal(record)) is not None:
        raise IllegalTransition(f"cannot cancel order {record.order_id}: {why}")
    if record.process_state is ProcessState.PENDING and nothing_sent(record):
        return cancel_at_once(record, now=now, by=by)
    return cancel_by_compensation(record, now=now, by=by)


def cancel_at_once(record: StateRecord, *, now: datetime, by: str) -> Update:
    """The row `cancel`: a Pending order none of whose steps was sent becomes Cancelled."""
    check_transition(Action.CANCEL, record.process_state, ProcessState.CANCELLED)
    if not nothing_sent(record):
        raise IllegalTransition(
            f"order {record.order_id} cannot be cancelled at once: a step was sent, so what it "
            "did is undone (cancel-by-compensation)"
        )
    return _cancelled(record, ProcessState.CANCELLED, now=now, by=by)


def cancel_by_compensation(record: StateRecord, *, now: datetime, by: str) -> Update:
    """The row `cancel-by-compensation`: an order that has begun becomes Compensating, unlocked
    and due, with a fresh failure count for the compensation's own recoveries (as when an
    operator asks for a compensation); the attempt that held it is fenced out."""
    check_transition(Action.CANCEL_BY_COMPENSATION, record.process_state, ProcessState.COMPENSATING)
    return _cancelled(
        record, ProcessState.COMPENSATING, now=now, by=by, next_attempt_at=now, failure_count=0
    )


def _cancelled(
    record: StateRecord, target: ProcessState, *, now: datetime, by: str, **more: Any
) -> Update:
    reason = ErrorInfo(kind=ErrorKind.CANCELLED, message=f"cancelled by {by}"[:2000], at=now)
    fields: dict[str, Any] = {
        "process_state": target,
        "locked_by": None,
        "complete_by": None,
        "error": reason,
        "updated_at": now,
        **more,
    }
    expect = Expect(
        process_state=frozenset({record.process_state}),
        locked_by=record.locked_by,
        updated_at=record.updated_at,
    )
    return Update(expect, Changes(fields=fields))
