"""Cancelling an order for its customer (`shared/domain/cancellation.py` decides what becomes of
it): the conditional write with its history event, read again while the order keeps changing
under it, then the `Cancelled` status to the order's application when it was cancelled at once.

A Processing order changes with every step, so a cancellation that finds it changed reads it
again, a few times: what it decides is decided for the order as it then is. An order cancelled
into compensation tells its application when its compensator finishes (`Compensated`, with the
cancellation as its detail), as every compensation does.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from shared.domain.cancellation import cancel
from shared.domain.journal import HistoryEvent, HistoryEventType
from shared.domain.messages import OrderStatus
from shared.domain.models import StateRecord
from shared.domain.states import ProcessState
from shared.domain.timing import utcnow
from shared.errors import IllegalTransition
from shared.reporting import Reporter
from shared.store.port import StateStore

READS = 5
"""How many times a cancellation reads an order that keeps changing before it gives up."""

StatusTeller = Callable[[StateRecord], Awaitable[None]]
"""Tells the order's application that it was cancelled (`Reporter.status`)."""


@dataclass(frozen=True)
class CancelOutcome:
    order_id: str
    before: ProcessState | None
    """The state it was cancelled from, or refused in (None: no such order)."""
    after: ProcessState | None = None
    """Cancelled or Compensating; None when refused."""
    refused: str | None = None
    """Why it was not cancelled."""

    @property
    def done(self) -> bool:
        return self.refused is None

    def __str__(self) -> str:
        if self.refused is not None:
            return f"refused: {self.refused}"
        return f"{self.before} -> {self.after}"


async def cancel_order(
    store: StateStore, order_id: str, *, by: str, tell: StatusTeller
) -> CancelOutcome:
    """Cancel the order, as it is when the write lands; `by` is who asked (for its history).
    `tell` tells its application when it is Cancelled at once: every way to cancel has one
    (`status_teller`), since an application following the order waits for that status."""
    record = None
    for _ in range(READS):
        record = await store.get_state(order_id)
        if record is None:
            return CancelOutcome(order_id, None, refused="no such order")
        now = utcnow()
        try:
            update = cancel(record, now=now, by=by)
        except IllegalTransition as exc:
            return CancelOutcome(order_id, record.process_state, refused=str(exc))
        target = update.changes.fields["process_state"]
        event = HistoryEvent(
            order_id=order_id,
            type=HistoryEventType.CANCELLED,
            at=now,
            attempt=record.attempt,
            instance_id=record.locked_by,
            data={"by": by, "from": record.process_state.value, "to": target.value},
        )
        after = await store.update_state(order_id, update.expect, update.changes, history=[event])
        if after is None:
            continue  # changed since it was read: decide again for the order as it is now
        if after.process_state is ProcessState.CANCELLED:
            await tell(after)
        return CancelOutcome(order_id, record.process_state, after.process_state)
    state = record.process_state if record is not None else None
    return CancelOutcome(
        order_id, state, refused=f"the order changed {READS} times while it was being cancelled"
    )


def status_teller(reporter: Reporter) -> StatusTeller:
    """Tells an order's application it was Cancelled, on its status queue, once (the message id
    is the same whoever cancels it and however often), through the reporter's publisher: the
    operator's broker user for `orderflow orders cancel`, the API's own for its endpoints."""

    async def tell(record: StateRecord) -> None:
        await reporter.status(
            record.order_id,
            record.reply_to,
            OrderStatus.CANCELLED,
            record.process_state,
            message_id=f"{record.order_id}:status:cancelled",
            detail=record.error.message if record.error is not None else None,
        )

    return tell
