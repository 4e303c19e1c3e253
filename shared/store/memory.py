"""The reference adapter of the state store: the port's semantics in memory, nothing more.

Built directly on the pure rules of `shared.domain.updates` (`matches`, `apply`): a conditional
update is those two functions over a dictionary, so this adapter is what the contract says, with
no query language or driver between. It passes the same contract suite as PostgreSQL and MongoDB
(`[memory]`), and serves the tests that drive processes without servers. It is not durable and is
shared only within one process (records are frozen models, handed out as they are kept).

Each operation runs without an await in its body, so it is atomic among the event loop's tasks,
as one statement is in the real stores; every method yields to the loop once first, so that
concurrent callers interleave between operations as they would over a connection.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Iterable, Sequence, Sized
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

from shared.domain.coordination import ComponentStatus, InboxOutcome, Lease
from shared.domain.identity import instance_id
from shared.domain.journal import Alert, CompensationEntry, HistoryEvent, UndoStatus
from shared.domain.models import OrderRecord, StateRecord
from shared.domain.states import TERMINAL_STATES, ProcessState
from shared.domain.updates import Changes, Expect, apply, matches
from shared.store.port import (
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

T = TypeVar("T")

TABLES = (
    "alerts",
    "compensation_log",
    "components",
    "history",
    "inbox",
    "lease",
    "orders",
    "state",
)


@dataclass(frozen=True)
class _Entry:
    """One inbox entry: a claim being handled, or a handled id kept for the dedupe window."""

    state: str  # "processing" or "done"
    holder: str
    expires_at: datetime


def _changed(record: StateRecord) -> tuple[datetime, str]:
    return record.updated_at, record.order_id


def _oldest(items: Iterable[T], key: Callable[[T], Any], limit: int) -> list[T]:
    return sorted(items, key=key)[:limit]


class MemoryStore:
    """State store in this process's memory (one hub; `MemoryStore()` per hub)."""

    kind = "memory"

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self._orders: dict[str, OrderRecord] = {}
        self._states: dict[str, StateRecord] = {}
        self._history: dict[int, HistoryEvent] = {}
        """By insertion number: an event's place among those of the same time."""
        self._compensation: dict[tuple[str, str], CompensationEntry] = {}
        self._inbox: dict[tuple[str, str], _Entry] = {}
        self._leases: dict[str, Lease] = {}
        self._alerts: dict[str, Alert] = {}
        self._components: dict[str, ComponentStatus] = {}
        self._numbers = itertools.count(1)

    async def init(self) -> None:
        await asyncio.sleep(0)

    async def ping(self) -> None:
        await asyncio.sleep(0)

    async def close(self) -> None:
        await asyncio.sleep(0)

    async def drop(self) -> None:
        await asyncio.sleep(0)
        self._reset()

    # -- orders and state records
    async def insert_order(self, order: OrderRecord, state: StateRecord) -> InsertOutcome:
        await asyncio.sleep(0)
        outcome = InsertOutcome.CREATED
        existing = self._orders.get(order.order_id)
        if existing is not None:
            if existing.fingerprint != order.fingerprint:
                return InsertOutcome.CONFLICT
            outcome = InsertOutcome.EXISTS
        self._orders.setdefault(order.order_id, order)
        self._states.setdefault(state.order_id, state)
        return outcome

    async def get_order(self, order_id: str) -> OrderRecord | None:
        await asyncio.sleep(0)
        return self._orders.get(order_id)

    async def get_orders(self, order_ids: Sequence[str]) -> list[OrderRecord | None]:
        await asyncio.sleep(0)
        return [self._orders.get(order_id) for order_id in order_ids]

    async def get_state(self, order_id: str) -> StateRecord | None:
        await asyncio.sleep(0)
        return self._states.get(order_id)

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
        await asyncio.sleep(0)
        record = self._states.get(order_id)
        if record is None or not matches(record, expect):
            return None
        after = self._states[order_id] = apply(record, changes)
        if compensation is not None:
            self._append_compensation(compensation)
        if undo is not None:
            self._mark_compensation(order_id, undo)
        self._append_history(history)
        return after

    async def claim(
        self,
        *,
        now: datetime,
        limit: int,
        owner: str,
        complete_by: datetime,
        compensating: bool = False,
    ) -> list[StateRecord]:
        await asyncio.sleep(0)
        source, target = (
            (ProcessState.COMPENSATING, ProcessState.COMPENSATING)
            if compensating
            else (ProcessState.PENDING, ProcessState.PROCESSING)
        )
        due = [
            r
            for r in self._states.values()
            if r.process_state is source
            and r.locked_by is None
            and r.next_attempt_at is not None
            and r.next_attempt_at <= now
        ]
        claimed = []
        for record in _oldest(due, lambda r: (r.next_attempt_at, r.order_id), limit):
            attempt = record.attempt + 1
            fields = {
                "process_state": target,
                "attempt": attempt,
                "locked_by": instance_id(record.order_id, attempt),
                "owner": owner,
                "complete_by": complete_by,
                "updated_at": now,
            }
            self._states[record.order_id] = apply(record, Changes(fields=fields))
            claimed.append(self._states[record.order_id])
        return claimed

    async def scan_expired(
        self,
        *,
        now: datetime,
        states: frozenset[ProcessState],
        limit: int,
        after: ScanCursor | None = None,
        not_before: datetime | None = None,
    ) -> ScanPage:
        await asyncio.sleep(0)

        def expired(r: StateRecord) -> bool:
            if r.process_state not in states or r.complete_by is None or r.complete_by > now:
                return False
            if not_before is not None and r.complete_by < not_before:
                return False
            return after is None or (r.complete_by, r.order_id) > (
                after.complete_by,
                after.order_id,
            )

        found = filter(expired, self._states.values())
        return page_of(_oldest(found, lambda r: (r.complete_by, r.order_id), limit), limit)

    async def count_by_state(self) -> dict[ProcessState, int]:
        await asyncio.sleep(0)
        counts = dict.fromkeys(ProcessState, 0)
        for record in self._states.values():
            counts[record.process_state] += 1
        return counts

    async def count_in_states(self, states: frozenset[ProcessState]) -> int:
        await asyncio.sleep(0)
        return sum(r.process_state in states for r in self._states.values())

    async def workflow_usage(self) -> list[WorkflowUse]:
        await asyncio.sleep(0)
        counts: dict[tuple[str, int, ProcessState], int] = {}
        for r in self._states.values():
            key = (r.workflow, r.workflow_version, r.process_state)
            counts[key] = counts.get(key, 0) + 1
        return [WorkflowUse(w, v, s, n) for (w, v, s), n in sorted(counts.items())]

    async def find_stuck_pending(self, *, due_before: datetime, limit: int) -> list[StateRecord]:
        await asyncio.sleep(0)
        stuck = [
            r
            for r in self._states.values()
            if r.process_state is ProcessState.PENDING
            and r.locked_by is None
            and r.next_attempt_at is not None
            and r.next_attempt_at < due_before
        ]
        return _oldest(stuck, lambda r: (r.next_attempt_at, r.order_id), limit)

    async def list_states(self, *, after: str | None, limit: int) -> list[StateRecord]:
        await asyncio.sleep(0)
        ids = [i for i in self._states if after is None or i > after]
        return [self._states[i] for i in sorted(ids)[:limit]]

    async def query_states(
        self, query: StateQuery, *, limit: int, after: ListCursor | None = None
    ) -> list[StateRecord]:
        await asyncio.sleep(0)

        def wanted(r: StateRecord) -> bool:
            if query.states is not None and r.process_state not in query.states:
                return False
            if query.changed_before is not None and not r.updated_at < query.changed_before:
                return False
            if query.error_kind is not None and (
                r.error is None or r.error.kind is not query.error_kind
            ):
                return False
            return after is None or (r.updated_at, r.order_id) < (after.updated_at, after.order_id)

        found = sorted(
            filter(wanted, self._states.values()), key=lambda r: (r.updated_at, r.order_id)
        )
        return found[::-1][:limit]

    async def list_order_ids(self, *, after: str | None, limit: int) -> list[str]:
        await asyncio.sleep(0)
        return sorted(i for i in self._orders if after is None or i > after)[:limit]

    # -- history
    def _append_history(self, events: Iterable[HistoryEvent]) -> None:
        for event in events:
            self._history[next(self._numbers)] = event.model_copy(update={"seq": None})

    async def append_history(self, event: HistoryEvent) -> None:
        await asyncio.sleep(0)
        self._append_history([event])

    async def append_history_many(self, events: Sequence[HistoryEvent]) -> None:
        await asyncio.sleep(0)
        self._append_history(events)

    async def read_history(self, order_id: str) -> list[HistoryEvent]:
        await asyncio.sleep(0)
        mine = sorted((e.at, n) for n, e in self._history.items() if e.order_id == order_id)
        return [
            self._history[n].model_copy(update={"seq": seq})
            for seq, (_, n) in enumerate(mine, start=1)
        ]

    # -- compensation log
    def _append_compensation(self, entry: CompensationEntry) -> bool:
        key = (entry.order_id, entry.step)
        if key in self._compensation:
            return False
        self._compensation[key] = entry.model_copy(update={"seq": next(self._numbers)})
        return True

    def _mark_compensation(self, order_id: str, undo: UndoMark) -> None:
        entry = self._compensation.get((order_id, undo.step))
        if entry is None or entry.status is UndoStatus.DONE:
            return
        done_at = undo.at if undo.status is UndoStatus.DONE else None
        self._compensation[(order_id, undo.step)] = entry.model_copy(
            update={"status": undo.status, "done_at": done_at, "error": undo.error}
        )

    async def append_compensation(self, entry: CompensationEntry) -> bool:
        await asyncio.sleep(0)
        return self._append_compensation(entry)

    async def read_compensation(self, order_id: str) -> list[CompensationEntry]:
        await asyncio.sleep(0)
        mine = [e for (o, _), e in self._compensation.items() if o == order_id]
        return sorted(mine, key=lambda e: e.seq or 0)

    # -- retention
    def _finished_before(self, order_id: str, cutoff: datetime) -> bool:
        record = self._states.get(order_id)
        return (
            record is not None
            and record.process_state in TERMINAL_STATES
            and record.updated_at < cutoff
        )

    async def purge_journal(self, *, finished_before: datetime, limit: int) -> Purged:
        await asyncio.sleep(0)
        history = [
            (e.at, n)
            for n, e in self._history.items()
            if e.at < finished_before and self._finished_before(e.order_id, finished_before)
        ]
        for _, n in sorted(history)[:limit]:
            del self._history[n]
        undos = [
            (e.recorded_at, e.seq or 0, key)
            for key, e in self._compensation.items()
            if e.recorded_at < finished_before
            and self._finished_before(e.order_id, finished_before)
        ]
        for *_, key in sorted(undos)[:limit]:
            del self._compensation[key]
        return Purged(history=min(len(history), limit), compensation=min(len(undos), limit))

    async def purge_orders(self, *, finished_before: datetime, limit: int) -> Purged:
        await asyncio.sleep(0)
        finished = [
            r for r in self._states.values() if self._finished_before(r.order_id, finished_before)
        ]
        ids = {r.order_id for r in _oldest(finished, lambda r: (r.updated_at, r.order_id), limit)}
        history = [n for n, e in self._history.items() if e.order_id in ids]
        undos = [key for key in self._compensation if key[0] in ids]
        for n in history:
            del self._history[n]
        for key in undos:
            del self._compensation[key]
        for order_id in ids:
            self._orders.pop(order_id, None)
            del self._states[order_id]
        return Purged(len(ids), len(history), len(undos))

    async def purge_alerts(self, *, raised_before: datetime, limit: int) -> int:
        await asyncio.sleep(0)
        old = [a for a in self._alerts.values() if a.at < raised_before]
        for alert in _oldest(old, lambda a: (a.at, a.alert_id), limit):
            del self._alerts[alert.alert_id]
        return min(len(old), limit)

    async def record_counts(self) -> dict[str, int]:
        await asyncio.sleep(0)
        sizes: dict[str, Sized] = {
            "alerts": self._alerts,
            "compensation_log": self._compensation,
            "components": self._components,
            "history": self._history,
            "inbox": self._inbox,
            "lease": self._leases,
            "orders": self._orders,
            "state": self._states,
        }
        return {name: len(sizes[name]) for name in TABLES}

    # -- inbox
    def _inbox_claim(
        self, queue: str, message_id: str, holder: str, now: datetime, claim_until: datetime
    ) -> InboxOutcome:
        key = (queue, message_id)
        entry = self._inbox.get(key)
        if (
            entry is None
            or entry.expires_at <= now
            or (entry.holder == holder and entry.state == "processing")
        ):
            self._inbox[key] = _Entry("processing", holder, claim_until)
            return InboxOutcome.CLAIMED
        return InboxOutcome.DUPLICATE if entry.state == "done" else InboxOutcome.BUSY

    async def inbox_claim(
        self, queue: str, message_id: str, *, holder: str, now: datetime, claim_until: datetime
    ) -> InboxOutcome:
        await asyncio.sleep(0)
        return self._inbox_claim(queue, message_id, holder, now, claim_until)

    async def inbox_claim_many(
        self, queue: str, claims: Sequence[InboxClaim], *, now: datetime
    ) -> list[InboxOutcome]:
        await asyncio.sleep(0)
        return [
            self._inbox_claim(queue, c.message_id, c.holder, now, c.claim_until) for c in claims
        ]

    def _inbox_complete(
        self, queue: str, message_id: str, holder: str, keep_until: datetime
    ) -> bool:
        # Written even where the claim expired and was purged (decision 90); an entry another
        # holder has taken since stays theirs.
        key = (queue, message_id)
        entry = self._inbox.get(key)
        if entry is not None and entry.holder != holder:
            return False
        self._inbox[key] = _Entry("done", holder, keep_until)
        return True

    async def inbox_complete(
        self, queue: str, message_id: str, *, holder: str, keep_until: datetime
    ) -> bool:
        await asyncio.sleep(0)
        return self._inbox_complete(queue, message_id, holder, keep_until)

    async def inbox_complete_many(self, queue: str, done: Sequence[InboxDone]) -> None:
        await asyncio.sleep(0)
        for d in done:
            self._inbox_complete(queue, d.message_id, d.holder, d.keep_until)

    async def inbox_release(self, queue: str, message_id: str, *, holder: str) -> bool:
        await asyncio.sleep(0)
        entry = self._inbox.get((queue, message_id))
        if entry is None or entry.holder != holder or entry.state != "processing":
            return False
        del self._inbox[(queue, message_id)]
        return True

    async def inbox_purge(self, *, now: datetime, limit: int) -> int:
        await asyncio.sleep(0)
        expired = [(e.expires_at, k) for k, e in self._inbox.items() if e.expires_at <= now]
        for _, key in sorted(expired)[:limit]:
            del self._inbox[key]
        return min(len(expired), limit)

    # -- lease
    async def lease_acquire(
        self, name: str, *, holder: str, now: datetime, expires_at: datetime
    ) -> bool:
        await asyncio.sleep(0)
        lease = self._leases.get(name)
        if lease is not None and lease.holder == holder and lease.expires_at > now:
            self._leases[name] = lease.model_copy(update={"expires_at": expires_at})
            return True
        if lease is not None and lease.holder != holder and lease.expires_at > now:
            return False
        self._leases[name] = Lease(name=name, holder=holder, expires_at=expires_at, acquired_at=now)
        return True

    async def lease_renew(
        self, name: str, *, holder: str, now: datetime, expires_at: datetime
    ) -> bool:
        await asyncio.sleep(0)
        lease = self._leases.get(name)
        if lease is None or lease.holder != holder or lease.expires_at <= now:
            return False
        self._leases[name] = lease.model_copy(update={"expires_at": expires_at})
        return True

    async def lease_release(self, name: str, *, holder: str) -> bool:
        await asyncio.sleep(0)
        lease = self._leases.get(name)
        if lease is None or lease.holder != holder:
            return False
        del self._leases[name]
        return True

    async def lease_get(self, name: str) -> Lease | None:
        await asyncio.sleep(0)
        return self._leases.get(name)

    # -- alerts
    async def raise_alert(self, alert: Alert) -> bool:
        await asyncio.sleep(0)
        if alert.alert_id in self._alerts:
            return False
        self._alerts[alert.alert_id] = alert
        return True

    async def list_alerts(self, *, since: datetime | None = None, limit: int = 100) -> list[Alert]:
        await asyncio.sleep(0)
        found = [a for a in self._alerts.values() if since is None or a.at >= since]
        found.sort(key=lambda a: a.alert_id)
        found.sort(key=lambda a: a.at, reverse=True)
        return found[:limit]

    # -- component status
    async def report_status(self, status: ComponentStatus) -> None:
        await asyncio.sleep(0)
        self._components[status.name] = status

    async def list_status(self, *, now: datetime) -> list[ComponentStatus]:
        await asyncio.sleep(0)
        live = [s for s in self._components.values() if s.expires_at > now]
        return sorted(live, key=lambda s: (s.kind, s.name))

    async def forget_status(self, name: str) -> None:
        await asyncio.sleep(0)
        self._components.pop(name, None)
