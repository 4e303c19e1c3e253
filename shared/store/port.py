"""The state store port (DESIGN §3): one Protocol, several adapters, one contract suite."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Protocol

from shared.domain.coordination import ComponentStatus, InboxOutcome, Lease
from shared.domain.journal import Alert, CompensationEntry, HistoryEvent, UndoStatus
from shared.domain.models import OrderRecord, StateRecord
from shared.domain.states import ErrorKind, ProcessState
from shared.domain.updates import Changes, Expect


class InsertOutcome(StrEnum):
    CREATED = "created"
    """The order was new: both records are written."""
    EXISTS = "exists"
    """The same order was recorded before (a redelivery or a repeated submission)."""
    CONFLICT = "conflict"
    """An order with this id but different data exists; nothing was overwritten."""


@dataclass(frozen=True)
class InboxClaim:
    """One consumer's bid for a message id (see `StateStore.inbox_claim_many`)."""

    message_id: str
    holder: str
    claim_until: datetime


@dataclass(frozen=True)
class InboxDone:
    """One handled message id (see `StateStore.inbox_complete_many`)."""

    message_id: str
    holder: str
    keep_until: datetime


@dataclass(frozen=True)
class UndoMark:
    """An undo's outcome in the compensation log (see `StateStore.update_state`)."""

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


class StateStore(Protocol):
    """Everything the processes keep. Every state change is conditional and says if it matched."""

    kind: str
    """`postgresql`, `mongodb` or `memory`: for reports and logs."""

    async def init(self) -> None:
        """Create the schema, collections and indexes. Idempotent."""

    async def ping(self) -> None:
        """Raise `ServiceUnavailable` unless the store answers."""

    async def close(self) -> None: ...

    async def drop(self) -> None:
        """Delete everything of this hub (tests and `orderflow` maintenance only)."""

    # -- orders and state records
    async def insert_order(self, order: OrderRecord, state: StateRecord) -> InsertOutcome:
        """Insert the order and its state record, each only if absent, never overwriting."""

    async def get_order(self, order_id: str) -> OrderRecord | None: ...

    async def get_orders(self, order_ids: Sequence[str]) -> list[OrderRecord | None]:
        """Several orders in one round trip: one entry per id, in order (None: no such order)."""

    async def get_state(self, order_id: str) -> StateRecord | None: ...

    async def update_state(
        self,
        order_id: str,
        expect: Expect,
        changes: Changes,
        *,
        history: Sequence[HistoryEvent] = (),
        compensation: CompensationEntry | None = None,
        undo: UndoMark | None = None,
    ) -> StateRecord | None:
        """Apply `changes` only if the record matches `expect`; the new record, or None.

        `history` events, a `compensation` entry (insert-if-absent) and an `undo` outcome (set
        unless that undo is Done already: Done is final) are written only when the update
        matched: in the same statement where the store allows (PostgreSQL), right after it
        otherwise. So the log is fenced like the record: a superseded compensator marks nothing.
        One round trip instead of three for a scheduler's step bookkeeping."""

    async def claim(
        self,
        *,
        now: datetime,
        limit: int,
        owner: str,
        complete_by: datetime,
        compensating: bool = False,
    ) -> list[StateRecord]:
        """Claim up to `limit` due, unlocked Pending records for one new attempt each.

        Each becomes Processing with `attempt`+1, `locked_by` = `<order_id>:<attempt>`, the
        given `owner`, and `complete_by` (so an attempt that dies before its first step is
        still found by the supervisor). Concurrent claimers never claim the same record twice.
        With `compensating`, claims unlocked Compensating records instead (they stay
        Compensating).
        """

    async def scan_expired(
        self,
        *,
        now: datetime,
        states: frozenset[ProcessState],
        limit: int,
        after: ScanCursor | None = None,
        not_before: datetime | None = None,
    ) -> ScanPage:
        """Records in `states` whose `complete_by` lies in [not_before, now], in
        (complete_by, order_id) order, starting after the cursor."""

    async def count_by_state(self) -> dict[ProcessState, int]: ...

    async def count_in_states(self, states: frozenset[ProcessState]) -> int:
        """How many records are in any of `states` (admission control's backlog)."""

    async def workflow_usage(self) -> list[WorkflowUse]:
        """State records per (workflow, version, state): which versions orders still use."""

    async def find_stuck_pending(self, *, due_before: datetime, limit: int) -> list[StateRecord]:
        """Unlocked Pending records that were due before `due_before`, oldest first."""

    async def list_states(self, *, after: str | None, limit: int) -> list[StateRecord]:
        """State records in order_id order, after `after` (for audits and listings)."""

    async def query_states(
        self, query: StateQuery, *, limit: int, after: ListCursor | None = None
    ) -> list[StateRecord]:
        """Records matching `query`, most recently changed first (updated_at, then order_id,
        descending), after `after`."""

    async def list_order_ids(self, *, after: str | None, limit: int) -> list[str]:
        """Order ids of the order records, in order, after `after`."""

    # -- history: the task hub's timeline
    async def append_history(self, event: HistoryEvent) -> None: ...

    async def append_history_many(self, events: Sequence[HistoryEvent]) -> None:
        """Several events in one round trip, in the order given."""

    async def read_history(self, order_id: str) -> list[HistoryEvent]:
        """Oldest first; each event has its `seq`."""

    # -- compensation log
    async def append_compensation(self, entry: CompensationEntry) -> bool:
        """Record a completed step's undo if not recorded yet; True if it was new."""

    async def read_compensation(self, order_id: str) -> list[CompensationEntry]:
        """In the order the steps completed (undo them in reverse)."""

    # -- retention (the supervisor leader; each call one bounded batch, safe to run twice at once)
    async def purge_journal(self, *, finished_before: datetime, limit: int) -> Purged:
        """Delete at most `limit` history events and at most `limit` compensation-log entries
        recorded before `finished_before` of orders that finished (Processed or Compensated)
        before it. Orders in any other state keep their journal, whatever its age."""

    async def purge_orders(self, *, finished_before: datetime, limit: int) -> Purged:
        """Delete at most `limit` orders that finished (Processed or Compensated) before
        `finished_before`: each one's order record, state record, history and compensation log,
        together. Parked (Error, CompensationFailed) and live orders are never deleted, nor an
        order record whose state record is missing (a submission that has not completed)."""

    async def purge_alerts(self, *, raised_before: datetime, limit: int) -> int:
        """Delete at most `limit` alerts raised before `raised_before`; how many."""

    async def record_counts(self) -> dict[str, int]:
        """How many records each table (PostgreSQL) or collection (MongoDB) of the hub holds,
        by its name: what retention keeps bounded, for soak runs and operators."""

    # -- inbox: MessageId dedupe
    async def inbox_claim(
        self, queue: str, message_id: str, *, holder: str, now: datetime, claim_until: datetime
    ) -> InboxOutcome:
        """Take a message id for handling, unless it was handled (or is being handled by another
        holder). Re-entrant: the same holder may claim again (a retry of the same delivery)."""

    async def inbox_claim_many(
        self, queue: str, claims: Sequence[InboxClaim], *, now: datetime
    ) -> list[InboxOutcome]:
        """`inbox_claim` for several message ids at once (one round trip where the store can):
        one outcome per claim, in order. Of two claims of one id by different holders in one
        call, the first may take it and the second finds it BUSY."""

    async def inbox_complete(
        self, queue: str, message_id: str, *, holder: str, keep_until: datetime
    ) -> bool:
        """Mark the message handled; duplicates within the window are dropped."""

    async def inbox_complete_many(self, queue: str, done: Sequence[InboxDone]) -> None:
        """`inbox_complete` for several message ids at once (an entry whose holder no longer
        holds its id changes nothing)."""

    async def inbox_release(self, queue: str, message_id: str, *, holder: str) -> bool:
        """Give up a claim whose handling failed, so a redelivery is handled again."""

    async def inbox_purge(self, *, now: datetime, limit: int) -> int:
        """Delete at most `limit` entries that expired by `now` (handled ids past the dedupe
        window, claims whose holder let them lapse); how many. A live claim is never deleted."""

    # -- lease: supervisor leader election
    async def lease_acquire(
        self, name: str, *, holder: str, now: datetime, expires_at: datetime
    ) -> bool:
        """Take the lease if it is free or expired, or extend it if `holder` has it."""

    async def lease_renew(
        self, name: str, *, holder: str, now: datetime, expires_at: datetime
    ) -> bool:
        """Extend the lease only if `holder` still has it and it has not expired."""

    async def lease_release(self, name: str, *, holder: str) -> bool: ...

    async def lease_get(self, name: str) -> Lease | None: ...

    # -- alerts
    async def raise_alert(self, alert: Alert) -> bool:
        """Store the alert unless one with its id exists; True if it was new."""

    async def list_alerts(self, *, since: datetime | None = None, limit: int = 100) -> list[Alert]:
        """Newest first."""

    # -- component status: heartbeats of the running processes
    async def report_status(self, status: ComponentStatus) -> None:
        """Insert or replace the status of `status.name`."""

    async def list_status(self, *, now: datetime) -> list[ComponentStatus]:
        """Unexpired statuses, by kind, then name."""

    async def forget_status(self, name: str) -> None:
        """A cleanly stopped process removes its status."""
