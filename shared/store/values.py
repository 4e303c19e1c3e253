"""The values the store port speaks in besides the domain's records: outcomes, cursors, batches."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from shared.domain.journal import UndoStatus
from shared.domain.models import StateRecord
from shared.domain.states import ErrorKind, ProcessState


class InsertOutcome(StrEnum):
    CREATED = "created"
    """The order was new: both records are written."""
    EXISTS = "exists"
    """The same order was recorded before (a redelivery or a repeated submission)."""
    CONFLICT = "conflict"
    """An order with this id but different data exists; nothing was overwritten."""


@dataclass(frozen=True)
class InboxClaim:
    """One consumer's bid for a message id (see `Inbox.inbox_claim_many`)."""

    message_id: str
    holder: str
    claim_until: datetime


@dataclass(frozen=True)
class InboxDone:
    """One handled message id (see `Inbox.inbox_complete_many`)."""

    message_id: str
    holder: str
    keep_until: datetime


@dataclass(frozen=True)
class UndoMark:
    """An undo's outcome in the compensation log (see `OrderStates.update_state`)."""

    step: str
    status: UndoStatus
    at: datetime
    error: str | None = None


@dataclass(frozen=True)
class ScanCursor:
    """Where the next page of a supervisor scan starts: after this (complete_by, order_id)."""

    complete_by: datetime
    order_id: str


@dataclass(frozen=True)
class ScanPage:
    records: list[StateRecord]
    next_cursor: ScanCursor | None
    """None when this page was the last."""


def page_of(records: list[StateRecord], limit: int) -> ScanPage:
    """A full page may have a successor: continue after its last record."""
    if len(records) < limit or not records:
        return ScanPage(records, None)
    last = records[-1]
    if last.complete_by is None:  # pragma: no cover - scans only return records with deadlines
        raise ValueError("a scanned record has no complete_by")
    return ScanPage(records, ScanCursor(last.complete_by, last.order_id))


@dataclass(frozen=True)
class StateQuery:
    """An operator's filter over state records (every field optional)."""

    states: frozenset[ProcessState] | None = None
    changed_before: datetime | None = None
    """Only records whose last change is older than this."""
    error_kind: ErrorKind | None = None


@dataclass(frozen=True)
class ListCursor:
    """Where the next page of a listing starts: after this (updated_at, order_id), going back."""

    updated_at: datetime
    order_id: str


@dataclass(frozen=True)
class AlertCursor:
    """Where the next page of alerts starts: after this (at, alert_id), newest first (alerts
    raised at one time come by id: many are raised at once, and a page may end among them)."""

    at: datetime
    alert_id: str


@dataclass(frozen=True)
class WorkflowUse:
    """How many state records of one workflow version are in one state."""

    workflow: str
    version: int
    state: ProcessState
    count: int


@dataclass(frozen=True)
class Purged:
    """What one retention batch deleted."""

    orders: int = 0
    """Finished orders deleted with every record of theirs (order, state, journal)."""
    history: int = 0
    """History events."""
    compensation: int = 0
    """Compensation-log entries."""

    def __add__(self, other: Purged) -> Purged:
        return Purged(
            self.orders + other.orders,
            self.history + other.history,
            self.compensation + other.compensation,
        )


class Wakers:
    """The arrival watchers of a store that sees every insert itself (the memory store), and
    the watch of a store that cannot watch (MongoDB here: `NEVER`)."""

    def __init__(self) -> None:
        self._wakes: dict[int, Callable[[], None]] = {}
        self._numbers = itertools.count()

    def watch(self, wake: Callable[[], None]) -> WakerWatch:
        number = next(self._numbers)
        self._wakes[number] = wake
        return WakerWatch(self, number)

    def forget(self, number: int) -> None:
        self._wakes.pop(number, None)

    def wake(self) -> None:
        for wake in list(self._wakes.values()):
            wake()


class WakerWatch:
    """An arrival watch among `Wakers` (`shared.store.port.ArrivalWatch`)."""

    def __init__(self, wakers: Wakers | None, number: int) -> None:
        self._wakers = wakers
        self._number = number
        self._closed = False

    @property
    def alive(self) -> bool:
        return not self._closed

    @property
    def tells(self) -> bool:
        return self._wakers is not None

    async def close(self) -> None:
        if self._wakers is not None:  # NEVER stays as it is, whoever closes it
            self._wakers.forget(self._number)
            self._closed = True


NEVER = WakerWatch(None, -1)
"""The watch of a store that cannot tell arrivals: it never wakes anyone, and its scheduler's
poll finds every record."""
