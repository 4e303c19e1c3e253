"""Retention on PostgreSQL: bounded purges of what expired, and the tables' sizes (`Purges`).

Every purge picks its batch by `ctid` under row locks (`FOR UPDATE SKIP LOCKED`: a row a consumer
is changing right now is passed over, not waited for) in the order of an index that matches its
condition, and deletes through a TID scan: the plan reads what it deletes, whatever the planner
estimates (a join against a batch read whole tables).
"""

from __future__ import annotations

from datetime import datetime

from shared.domain.states import TERMINAL_STATES
from shared.store.postgres.connection import PostgresPart, affected
from shared.store.values import Purged

_FINISHED = ", ".join(f"'{state.value}'" for state in sorted(TERMINAL_STATES))
"""The finished states as SQL literals, as the partial index `state_finished_3` names them (a
parameter could not be proven to match its predicate)."""


class PostgresRetention(PostgresPart):
    async def purge_journal(self, *, finished_before: datetime, limit: int) -> Purged:
        # Oldest rows first through the time indexes; each row's order is looked up by its key
        # (a subplan, not a join), so a batch reads what it deletes and the old rows of the few
        # orders still parked or live.
        finished = (
            f"(SELECT s.updated_at FROM {self._s}.state s WHERE s.order_id = j.order_id "
            f"AND s.process_state IN ({_FINISHED})) < $1"
        )
        row = await self._pool.fetchrow(
            f"""
            WITH h AS (
                DELETE FROM {self._s}.history WHERE ctid = ANY(ARRAY(
                    SELECT j.ctid FROM {self._s}.history j
                     WHERE j.at < $1 AND {finished}
                     ORDER BY j.at LIMIT $2 FOR UPDATE SKIP LOCKED))
                RETURNING 1
            ), c AS (
                DELETE FROM {self._s}.compensation_log WHERE ctid = ANY(ARRAY(
                    SELECT j.ctid FROM {self._s}.compensation_log j
                     WHERE j.recorded_at < $1 AND {finished}
                     ORDER BY j.recorded_at LIMIT $2 FOR UPDATE SKIP LOCKED))
                RETURNING 1
            )
            SELECT (SELECT count(*) FROM h) AS history, (SELECT count(*) FROM c) AS compensation
            """,
            finished_before,
            limit,
        )
        assert row is not None
        return Purged(history=row["history"], compensation=row["compensation"])

    async def purge_orders(self, *, finished_before: datetime, limit: int) -> Purged:
        # One statement: the state records (their condition re-checked as they are locked), then
        # what belongs to exactly those orders. A crash leaves all of it or none.
        row = await self._pool.fetchrow(
            f"""
            WITH s AS (
                DELETE FROM {self._s}.state WHERE ctid = ANY(ARRAY(
                    SELECT ctid FROM {self._s}.state
                     WHERE process_state IN ({_FINISHED}) AND updated_at < $1
                     ORDER BY updated_at LIMIT $2 FOR UPDATE SKIP LOCKED))
                RETURNING order_id
            ), o AS (
                DELETE FROM {self._s}.orders WHERE order_id = ANY(ARRAY(SELECT order_id FROM s))
                RETURNING 1
            ), h AS (
                DELETE FROM {self._s}.history WHERE order_id = ANY(ARRAY(SELECT order_id FROM s))
                RETURNING 1
            ), c AS (
                DELETE FROM {self._s}.compensation_log
                 WHERE order_id = ANY(ARRAY(SELECT order_id FROM s))
                RETURNING 1
            )
            SELECT (SELECT count(*) FROM s) AS orders, (SELECT count(*) FROM h) AS history,
                   (SELECT count(*) FROM c) AS compensation
            """,
            finished_before,
            limit,
        )
        assert row is not None
        return Purged(row["orders"], row["history"], row["compensation"])

    async def purge_alerts(self, *, raised_before: datetime, limit: int) -> int:
        result = await self._pool.execute(
            f"DELETE FROM {self._s}.alerts WHERE ctid = ANY(ARRAY(SELECT ctid FROM "
            f"{self._s}.alerts WHERE at < $1 ORDER BY at LIMIT $2 FOR UPDATE SKIP LOCKED))",
            raised_before,
            limit,
        )
        return affected(result)

    async def inbox_purge(self, *, now: datetime, limit: int) -> int:
        # Oldest expiry first through `inbox_expiry`, as every purge (see purge_journal); an
        # entry a consumer is claiming right now (its row locked) is skipped, not waited for.
        result = await self._pool.execute(
            f"DELETE FROM {self._s}.inbox WHERE ctid = ANY(ARRAY(SELECT ctid FROM {self._s}.inbox "
            "WHERE expires_at <= $1 ORDER BY expires_at LIMIT $2 FOR UPDATE SKIP LOCKED))",
            now,
            limit,
        )
        return affected(result)

    async def record_counts(self) -> dict[str, int]:
        tables = await self._pool.fetch(
            "SELECT tablename FROM pg_tables WHERE schemaname = $1 ORDER BY tablename",
            self._schema,
        )
        counts = {}
        for table in tables:
            name = table["tablename"]
            query = f'SELECT count(*) FROM {self._s}."{name}"'
            counts[name] = int(await self._pool.fetchval(query))
        return counts
