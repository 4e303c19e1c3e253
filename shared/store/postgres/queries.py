"""Finding and counting state records on PostgreSQL (`StateQueries`)."""

from __future__ import annotations

from datetime import datetime

from shared.domain.models import StateRecord
from shared.domain.states import ProcessState
from shared.store.codec import state_from
from shared.store.postgres.connection import PostgresPart
from shared.store.values import ListCursor, ScanCursor, ScanPage, StateQuery, WorkflowUse, page_of


class PostgresQueries(PostgresPart):
    async def scan_expired(
        self,
        *,
        now: datetime,
        states: frozenset[ProcessState],
        limit: int,
        after: ScanCursor | None = None,
        not_before: datetime | None = None,
    ) -> ScanPage:
        rows = await self._pool.fetch(
            f"""
            SELECT * FROM {self._s}.state
             WHERE process_state = ANY($1) AND complete_by <= $2
               AND ($3::timestamptz IS NULL OR complete_by >= $3)
               AND ($4::timestamptz IS NULL OR (complete_by, order_id) > ($4, $5))
             ORDER BY complete_by, order_id
             LIMIT $6
            """,
            [s.value for s in states],
            now,
            not_before,
            after.complete_by if after else None,
            after.order_id if after else "",
            limit,
        )
        records = [state_from(dict(r)) for r in rows]
        return page_of(records, limit)

    async def find_stuck_pending(self, *, due_before: datetime, limit: int) -> list[StateRecord]:
        rows = await self._pool.fetch(
            f"SELECT * FROM {self._s}.state WHERE process_state = 'Pending' "
            "AND locked_by IS NULL AND next_attempt_at < $1 ORDER BY next_attempt_at LIMIT $2",
            due_before,
            limit,
        )
        return [state_from(dict(r)) for r in rows]

    async def list_states(self, *, after: str | None, limit: int) -> list[StateRecord]:
        rows = await self._pool.fetch(
            f"SELECT * FROM {self._s}.state WHERE order_id > $1 ORDER BY order_id LIMIT $2",
            after or "",
            limit,
        )
        return [state_from(dict(r)) for r in rows]

    async def query_states(
        self, query: StateQuery, *, limit: int, after: ListCursor | None = None
    ) -> list[StateRecord]:
        states = None if query.states is None else sorted(s.value for s in query.states)
        rows = await self._pool.fetch(
            f"SELECT * FROM {self._s}.state WHERE "
            "($1::text[] IS NULL OR process_state = ANY($1)) "
            "AND ($2::timestamptz IS NULL OR updated_at < $2) "
            "AND ($3::text IS NULL OR error->>'kind' = $3) "
            "AND ($4::timestamptz IS NULL OR (updated_at, order_id) < ($4, $5)) "
            "ORDER BY updated_at DESC, order_id DESC LIMIT $6",
            states,
            query.changed_before,
            None if query.error_kind is None else query.error_kind.value,
            None if after is None else after.updated_at,
            None if after is None else after.order_id,
            limit,
        )
        return [state_from(dict(r)) for r in rows]

    async def list_order_ids(self, *, after: str | None, limit: int) -> list[str]:
        rows = await self._pool.fetch(
            f"SELECT order_id FROM {self._s}.orders WHERE order_id > $1 ORDER BY order_id LIMIT $2",
            after or "",
            limit,
        )
        return [r["order_id"] for r in rows]

    async def count_by_state(self) -> dict[ProcessState, int]:
        rows = await self._pool.fetch(
            f"SELECT process_state, count(*) AS n FROM {self._s}.state GROUP BY process_state"
        )
        counts = dict.fromkeys(ProcessState, 0)
        counts.update({ProcessState(r["process_state"]): r["n"] for r in rows})
        return counts

    async def count_in_states(self, states: frozenset[ProcessState]) -> int:
        n = await self._pool.fetchval(
            f"SELECT count(*) FROM {self._s}.state WHERE process_state = ANY($1)",
            [s.value for s in states],
        )
        return int(n)

    async def workflow_usage(self) -> list[WorkflowUse]:
        rows = await self._pool.fetch(
            f"SELECT workflow, workflow_version, process_state, count(*) AS n FROM {self._s}.state "
            "GROUP BY workflow, workflow_version, process_state ORDER BY 1, 2, 3"
        )
        return [
            WorkflowUse(
                r["workflow"], r["workflow_version"], ProcessState(r["process_state"]), r["n"]
            )
            for r in rows
        ]
