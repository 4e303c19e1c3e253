"""Finding and counting state records in memory (`StateQueries`)."""

from __future__ import annotations

from datetime import datetime

from shared.domain.models import StateRecord
from shared.domain.states import ProcessState
from shared.store.memory.tables import MemoryPart, oldest
from shared.store.values import ListCursor, ScanCursor, ScanPage, StateQuery, WorkflowUse, page_of


class MemoryQueries(MemoryPart):
    async def scan_expired(
        self,
        *,
        now: datetime,
        states: frozenset[ProcessState],
        limit: int,
        after: ScanCursor | None = None,
        not_before: datetime | None = None,
    ) -> ScanPage:

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
        return page_of(oldest(found, lambda r: (r.complete_by, r.order_id), limit), limit)

    async def count_by_state(self) -> dict[ProcessState, int]:
        counts = dict.fromkeys(ProcessState, 0)
        for record in self._states.values():
            counts[record.process_state] += 1
        return counts

    async def count_in_states(self, states: frozenset[ProcessState]) -> int:
        return sum(r.process_state in states for r in self._states.values())

    async def workflow_usage(self) -> list[WorkflowUse]:
        counts: dict[tuple[str, int, ProcessState], int] = {}
        for r in self._states.values():
            key = (r.workflow, r.workflow_version, r.process_state)
            counts[key] = counts.get(key, 0) + 1
        return [WorkflowUse(w, v, s, n) for (w, v, s), n in sorted(counts.items())]

    async def find_stuck_pending(self, *, due_before: datetime, limit: int) -> list[StateRecord]:
        stuck = [
            r
            for r in self._states.values()
            if r.process_state is ProcessState.PENDING
            and r.locked_by is None
            and r.next_attempt_at is not None
            and r.next_attempt_at < due_before
        ]
        return oldest(stuck, lambda r: (r.next_attempt_at, r.order_id), limit)

    async def list_states(self, *, after: str | None, limit: int) -> list[StateRecord]:
        ids = [i for i in self._states if after is None or i > after]
        return [self._states[i] for i in sorted(ids)[:limit]]

    async def query_states(
        self, query: StateQuery, *, limit: int, after: ListCursor | None = None
    ) -> list[StateRecord]:

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
        return sorted(i for i in self._orders if after is None or i > after)[:limit]
