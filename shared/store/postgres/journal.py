"""The journal on PostgreSQL: history and the compensation log (`Journal`)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from shared.domain.journal import CompensationEntry, HistoryEvent
from shared.store.codec import jsonable
from shared.store.postgres.connection import PostgresPart, read_row


class PostgresJournal(PostgresPart):
    async def append_history(self, event: HistoryEvent) -> None:
        await self.append_history_many([event])

    async def append_history_many(self, events: Sequence[HistoryEvent]) -> None:
        if not events:
            return
        await self._pool.executemany(
            f"INSERT INTO {self._s}.history "
            "(order_id, type, at, attempt, instance_id, step, data, schema_version)"
            " VALUES ($1, $2, $3, $4, $5, $6, $7::text::jsonb, $8)",
            [history_row(e) for e in events],
        )

    async def read_history(self, order_id: str) -> list[HistoryEvent]:
        rows = await self._pool.fetch(
            f"SELECT * FROM {self._s}.history WHERE order_id = $1 ORDER BY seq", order_id
        )
        return [read_row(HistoryEvent, r) for r in rows]

    async def read_compensation(self, order_id: str) -> list[CompensationEntry]:
        rows = await self._pool.fetch(
            f"SELECT * FROM {self._s}.compensation_log WHERE order_id = $1 ORDER BY seq",
            order_id,
        )
        return [read_row(CompensationEntry, r) for r in rows]

    async def append_compensation(self, entry: CompensationEntry) -> bool:
        """Not on the port: a process records an undo with its state change (`update_state`);
        the contract suite sets up log entries with this."""
        created = await self._pool.fetchval(
            f"INSERT INTO {self._s}.compensation_log (order_id, step, undo, idempotency_key, "
            "recorded_at, status, done_at, error, schema_version) "
            "VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) "
            "ON CONFLICT (order_id, step) DO NOTHING RETURNING true",
            entry.order_id,
            entry.step,
            entry.undo,
            entry.idempotency_key,
            entry.recorded_at,
            entry.status.value,
            entry.done_at,
            entry.error,
            entry.schema_version,
        )
        return bool(created)


def history_row(e: HistoryEvent) -> tuple[Any, ...]:
    """A history event as column values; `data` as JSON text (cast to jsonb in SQL)."""
    return (
        e.order_id,
        e.type.value,
        e.at,
        e.attempt,
        e.instance_id,
        e.step,
        json.dumps(jsonable(e.data)),
        e.schema_version,
    )
