"""Order and state records in memory: insert, read, conditional update, claim (`OrderStates`).
A conditional update is `matches` and `apply` of `shared.domain.updates` over the table."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime

from shared.domain.claims import claim_for
from shared.domain.journal import CompensationEntry, HistoryEvent
from shared.domain.models import OrderRecord, StateRecord
from shared.domain.updates import Changes, Expect, apply, matches
from shared.store.memory.journal import MemoryJournal
from shared.store.memory.tables import oldest
from shared.store.port import ArrivalWatch
from shared.store.values import InsertOutcome, UndoMark


class MemoryStates(MemoryJournal):
    """The state writes carry their journal entries (`update_state`), hence the journal part."""

    async def insert_order(
        self, order: OrderRecord, state: StateRecord, *, history: Sequence[HistoryEvent] = ()
    ) -> InsertOutcome:
        outcome = InsertOutcome.CREATED
        existing = self._orders.get(order.order_id)
        if existing is not None:
            if existing.fingerprint != order.fingerprint:
                return InsertOutcome.CONFLICT
            outcome = InsertOutcome.EXISTS
        self._orders.setdefault(order.order_id, order)
        if outcome is InsertOutcome.CREATED:
            self._append_history(history)
        if state.order_id not in self._states:
            self._states[state.order_id] = state
            self._arrivals.wake()
        return outcome

    async def watch_arrivals(self, wake: Callable[[], None]) -> ArrivalWatch:
        return self._arrivals.watch(wake)

    async def get_order(self, order_id: str) -> OrderRecord | None:
        return self._orders.get(order_id)

    async def get_orders(self, order_ids: Sequence[str]) -> list[OrderRecord | None]:
        return [self._orders.get(order_id) for order_id in order_ids]

    async def get_state(self, order_id: str) -> StateRecord | None:
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
        started_by: str | None = None,
    ) -> list[StateRecord]:
        spec = claim_for(
            now=now, limit=limit, owner=owner, complete_by=complete_by, compensating=compensating
        )
        due = [r for r in self._states.values() if matches(r, spec.expect)]
        claimed = []
        for record in oldest(due, lambda r: (r.next_attempt_at, r.order_id), spec.limit):
            changes = spec.changes(record.order_id, record.attempt)
            claimed.append(apply(record, changes))
            self._states[record.order_id] = claimed[-1]
            if started_by is not None:
                self._append_history([spec.started(record.order_id, record.attempt, by=started_by)])
        return claimed
