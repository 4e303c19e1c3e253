"""The state store port (DESIGN §3): narrow Protocols as the callers use them, one composite.

Each Protocol is one part of what the processes keep, and a caller names the parts it uses: the
consumer the `Inbox`, the heartbeat the `ComponentStatuses`, the supervisor's retention the
`Purges`, the API's authentication the `ApiTokens`. `StateStore` is all of them: what every
adapter implements (PostgreSQL, MongoDB, the reference adapter in memory) and what the one
contract suite runs against. Every state change is conditional and says if it matched.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Protocol

from shared.domain.coordination import ComponentStatus, InboxOutcome, Lease
from shared.domain.journal import Alert, AlertAction, AlertState, CompensationEntry, HistoryEvent
from shared.domain.models import OrderRecord, StateRecord
from shared.domain.states import ProcessState
from shared.domain.tokens import ApiToken
from shared.domain.updates import Changes, Expect
from shared.store.values import (
    AlertCursor,
    InboxClaim,
    InboxDone,
    InsertOutcome,
    ListCursor,
    Purged,
    ScanCursor,
    ScanPage,
    StateQuery,
    UndoMark,
    WorkflowUse,
    page_of,
)

__all__ = [
    "AlertCursor",
    "Alerts",
    "ApiTokens",
    "ArrivalWatch",
    "ComponentStatuses",
    "Inbox",
    "InboxClaim",
    "InboxDone",
    "InsertOutcome",
    "Journal",
    "Leases",
    "ListCursor",
    "OrderStates",
    "Purged",
    "Purges",
    "ScanCursor",
    "ScanPage",
    "StateQueries",
    "StateQuery",
    "StateStore",
    "StoreAdmin",
    "UndoMark",
    "WorkflowUse",
    "page_of",
]


class ArrivalWatch(Protocol):
    """A watch for new state records (`OrderStates.watch_arrivals`)."""

    @property
    def alive(self) -> bool:
        """False once the watch can no longer wake anyone (its connection was lost)."""

    @property
    def tells(self) -> bool:
        """Whether arrivals wake it at all (False: a store that cannot watch)."""

    async def close(self) -> None: ...


class OrderStates(Protocol):
    """Order and state records by id, and their conditional changes: submission, scheduler,
    supervisor, operator."""

    async def insert_order(
        self, order: OrderRecord, state: StateRecord, *, history: Sequence[HistoryEvent] = ()
    ) -> InsertOutcome:
        """Insert the order and its state record, each only if absent, never overwriting;
        `history` is appended only when the order was new (CREATED): in the same statement
        where the store allows (PostgreSQL), right after otherwise. A state record inserted
        here tells the arrival watchers (`watch_arrivals`)."""

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

    async def watch_arrivals(self, wake: Callable[[], None]) -> ArrivalWatch:
        """Call `wake` (soon, perhaps once for several) whenever a new state record is inserted,
        by any process, until the watch is closed: a scheduler claims at once instead of at
        its next poll. A hint only: a wake may be lost (a reconnect), and a store that cannot
        watch never wakes (the scheduler's poll finds the records anyway)."""

    async def claim(
        self,
        *,
        now: datetime,
        limit: int,
        owner: str,
        complete_by: datetime,
        compensating: bool = False,
        started_by: str | None = None,
    ) -> list[StateRecord]:
        """Claim up to `limit` due, unlocked Pending records for one new attempt each.

        Each becomes Processing with `attempt`+1, `locked_by` = `<order_id>:<attempt>.<nonce>`
        (one random nonce per call: a claim a failover rolls back never lends its token to the
        next one, shared/domain/identity.py), the given `owner`, and `complete_by` (so an
        attempt that dies before its first step is still found by the supervisor). Concurrent
        claimers never claim the same record twice.
        With `compensating`, claims unlocked Compensating records instead (they stay
        Compensating). With `started_by`, each record claimed gets its `ExecutionStarted`
        event (`Claim.started`, by that process) in the same write: no history append of its
        own after the claim.
        """


class StateQueries(Protocol):
    """Finding and counting state records: the supervisor's scans, listings, audits, gauges."""

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

    async def count_by_state(self) -> dict[ProcessState, int]: ...

    async def count_in_states(self, states: frozenset[ProcessState]) -> int:
        """How many records are in any of `states` (admission control's backlog)."""

    async def workflow_usage(self) -> list[WorkflowUse]:
        """State records per (workflow, version, state): which versions orders still use."""


class Journal(Protocol):
    """The task hub's timeline (history) and the compensation log, as the processes read and
    append them (a compensation entry is written with its state change: `update_state`).

    An order's journal belongs to its state record: an event of an order that has none (never
    recorded, or deleted by retention) need not be kept (MongoDB keeps the journal in the
    record's document and has nowhere to put it). A store may keep only an order's newest
    events past a bound (MongoDB: `HISTORY_KEPT`); the events kept keep their `seq`."""

    async def append_history(self, event: HistoryEvent) -> None: ...

    async def append_history_many(self, events: Sequence[HistoryEvent]) -> None:
        """Several events in one round trip, in the order given."""

    async def read_history(self, order_id: str) -> list[HistoryEvent]:
        """Oldest first; each event has its `seq`."""

    async def read_compensation(self, order_id: str) -> list[CompensationEntry]:
        """In the order the steps completed (undo them in reverse)."""


class Inbox(Protocol):
    """MessageId dedupe: what a consumer claims, completes and releases."""

    async def inbox_claim_many(
        self, queue: str, claims: Sequence[InboxClaim], *, now: datetime
    ) -> list[InboxOutcome]:
        """Take each message id for handling, unless it was handled (or is being handled by
        another holder): one outcome per claim, in order, in one round trip where the store can.
        Re-entrant: the same holder may claim again (a retry of the same delivery). Of two claims
        of one id by different holders in one call, the first may take it and the second finds
        it BUSY."""

    async def inbox_complete_many(self, queue: str, done: Sequence[InboxDone]) -> None:
        """Mark each message handled, so duplicates within its window are dropped (an entry
        whose holder no longer holds its id changes nothing)."""

    async def inbox_release(self, queue: str, message_id: str, *, holder: str) -> bool:
        """Give up a claim whose handling failed, so a redelivery is handled again."""


class Leases(Protocol):
    """Supervisor leader election."""

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


class Alerts(Protocol):
    """Alerts raised for operators."""

    async def raise_alert(self, alert: Alert) -> bool:
        """Store the alert unless one with its id exists; True if it was new."""

    async def list_alerts(
        self, *, since: datetime | None = None, limit: int = 100, after: AlertCursor | None = None
    ) -> list[Alert]:
        """Alerts raised at or after `since`, newest first (then by id); with `after` (the last
        alert read), those that come after it: the next page."""

    async def mark_alert(
        self, alert_id: str, action: AlertAction, *, by: str, at: datetime
    ) -> AlertState | None:
        """Record that `by` took `action` on the alert at `at`, unless it was recorded before
        (the first record stands); the alert's state after, or None if there is no such alert."""

    async def alert_states(self, alert_ids: Sequence[str]) -> dict[str, AlertState]:
        """The state of each of these alerts that exists (one with no action: all None)."""

    async def changed_alerts(
        self, *, since: datetime, limit: int, after: str | None = None
    ) -> list[tuple[Alert, AlertState]]:
        """Alerts acknowledged or resolved at or after `since`, oldest change first (then by
        id); with `after` (an alert id), of the changes at exactly `since` only those of later
        ids: the next page after the last one read (many alerts resolved at once share a time)."""


class ComponentStatuses(Protocol):
    """Heartbeats of the running processes."""

    async def report_status(self, status: ComponentStatus) -> None:
        """Insert or replace the status of `status.name`."""

    async def list_status(self, *, now: datetime) -> list[ComponentStatus]:
        """Unexpired statuses, by kind, then name."""

    async def forget_status(self, name: str) -> None:
        """A cleanly stopped process removes its status."""


class ApiTokens(Protocol):
    """API tokens, kept hashed (shared/domain/tokens.py): made, revoked and listed by the
    operator (`orderflow tokens`), looked up by digest on every API request."""

    async def token_create(self, token: ApiToken) -> bool:
        """Insert the token; False, and nothing written, when an active (not revoked) token
        already has its name (or its digest). Of concurrent creates of one name, one wins. A
        revoked token's name may be reused."""

    async def token_find(self, digest: str) -> ApiToken | None:
        """The active token with that digest; None if there is none, or it was revoked."""

    async def token_revoke(self, name: str, *, at: datetime) -> bool:
        """Mark the active token of that name revoked `at`; False when no active token has it."""

    async def token_list(self) -> list[ApiToken]:
        """Every token, active and revoked, newest first (then by name, then digest)."""


class Purges(Protocol):
    """Retention (the supervisor leader): each call one bounded batch, safe to run twice at
    once; and the sizes retention keeps bounded."""

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

    async def inbox_purge(self, *, now: datetime, limit: int) -> int:
        """Delete at most `limit` entries that expired by `now` (handled ids past the dedupe
        window, claims whose holder let them lapse); how many. A live claim is never deleted."""

    async def record_counts(self) -> dict[str, int]:
        """How many records each table (PostgreSQL) or collection (MongoDB) of the hub holds,
        by its name: what retention keeps bounded, for soak runs and operators. The counts may
        be estimates (MongoDB's come from each collection's metadata, without a scan, and can
        be off after an unclean shutdown): sizes to watch, not figures to reconcile."""


class StoreAdmin(Protocol):
    """The store itself: its kind, schema, health and connection."""

    kind: str
    """`postgresql`, `mongodb` or `memory`: for reports and logs."""

    async def init(self) -> None:
        """Create the schema, collections and indexes. Idempotent."""

    async def ping(self) -> None:
        """Raise `ServiceUnavailable` unless the store answers."""

    async def close(self) -> None: ...

    async def drop(self) -> None:
        """Delete everything of this hub (tests and `orderflow` maintenance only)."""


class StateStore(
    OrderStates,
    StateQueries,
    Journal,
    Inbox,
    Leases,
    Alerts,
    ComponentStatuses,
    ApiTokens,
    Purges,
    StoreAdmin,
    Protocol,
):
    """Everything the processes keep: what every adapter implements, and what a caller that
    truly needs all of it (the bootstrap, the CLI) names."""
