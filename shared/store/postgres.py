"""The PostgreSQL adapter of the state store, through asyncpg."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime, timedelta
from importlib import resources
from typing import Any, TypeVar

import asyncpg
from pydantic import BaseModel

from shared import crash
from shared.domain.coordination import ComponentStatus, InboxOutcome, Lease
from shared.domain.journal import Alert, CompensationEntry, HistoryEvent, UndoStatus
from shared.domain.models import STORED, OrderRecord, StateRecord
from shared.domain.states import TERMINAL_STATES, ProcessState
from shared.domain.updates import ANY, Changes, Expect
from shared.errors import ConfigurationError, ServiceUnavailable, one_line
from shared.store.codec import jsonable, state_from
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
from shared.store.unavailable import translate_errors
from shared.store.urls import redact

_JSON_COLUMNS = frozenset({"steps", "retry_budget", "error", "data"})
_STATE_COLUMNS = (
    "order_id",
    "process_state",
    "locked_by",
    "owner",
    "complete_by",
    "failure_count",
    "attempt",
    "workflow",
    "workflow_version",
    "schema_version",
    "steps",
    "retry_budget",
    "reply_to",
    "next_attempt_at",
    "error",
    "created_at",
    "updated_at",
)


async def _init_connection(conn: asyncpg.Connection) -> None:
    await conn.set_type_codec("jsonb", encoder=json.dumps, decoder=json.loads, schema="pg_catalog")


def _column_value(name: str, value: Any) -> Any:
    return jsonable(value) if name in _JSON_COLUMNS else jsonable_scalar(value)


def jsonable_scalar(value: Any) -> Any:
    """Enums to values; datetimes stay datetimes for timestamptz columns."""
    return getattr(value, "value", value) if not isinstance(value, datetime) else value


_UNAVAILABLE = (
    OSError,
    TimeoutError,
    asyncpg.InterfaceError,
    asyncpg.PostgresConnectionError,
    asyncpg.OperatorInterventionError,
    asyncpg.TooManyConnectionsError,
)


_REFUSED = (
    asyncpg.DataError,  # the server's SQLSTATE class 22: NUL in text, a value out of range
    asyncpg.exceptions._base.DataError,  # the client's: a parameter it cannot encode
    UnicodeEncodeError,
)


@translate_errors("PostgreSQL", unavailable=_UNAVAILABLE, refused=_REFUSED)
class PostgresStore:
    """State store on PostgreSQL: one schema per task hub."""

    kind = "postgresql"

    def __init__(self, pool: asyncpg.Pool, schema: str) -> None:
        self._pool = pool
        self._s = f'"{schema}"'
        self._schema = schema

    @classmethod
    async def connect(
        cls, url: str, schema: str, *, pool_size: int, timeout: float, command_timeout: float
    ) -> PostgresStore:
        try:
            pool = await asyncpg.create_pool(
                url,
                min_size=1,
                max_size=pool_size,
                timeout=timeout,
                command_timeout=command_timeout,
                init=_init_connection,
                reset=_reset_connection,
            )
        except (ValueError, asyncpg.InterfaceError) as exc:
            raise ConfigurationError(f"store URL {redact(url)}: {one_line(exc)}") from exc
        except (OSError, asyncpg.PostgresError, TimeoutError) as exc:
            raise ServiceUnavailable(
                f"PostgreSQL at {redact(url)} is unreachable: {one_line(exc)}"
            ) from exc
        return cls(pool, schema)

    async def init(self) -> None:
        ddl = resources.files("shared.store").joinpath("postgres_schema.sql").read_text()
        async with self._pool.acquire() as conn, conn.transaction():
            # Two processes initialising at once would race on CREATE ... IF NOT EXISTS.
            await conn.execute("SELECT pg_advisory_xact_lock(hashtext('orderflow-init'))")
            await conn.execute(ddl.replace("{schema}", self._schema))

    async def ping(self) -> None:
        try:
            await self._pool.fetchval("SELECT 1")
        except (OSError, asyncpg.PostgresError) as exc:
            raise ServiceUnavailable(f"PostgreSQL does not answer: {one_line(exc)}") from exc

    async def close(self) -> None:
        await self._pool.close()

    async def drop(self) -> None:
        await self._pool.execute(f"DROP SCHEMA IF EXISTS {self._s} CASCADE")

    # -- orders and state records
    async def insert_order(self, order: OrderRecord, state: StateRecord) -> InsertOutcome:
        # Two insert-if-absent writes that share no transaction, as on MongoDB: a crash between
        # them leaves an order without its state record, which the redelivered message completes
        # (the order is found with the same data, the state is inserted).
        async with self._pool.acquire() as conn:
            created = await conn.fetchval(
                f"INSERT INTO {self._s}.orders VALUES ($1, $2, $3, $4, $5) "
                "ON CONFLICT (order_id) DO NOTHING RETURNING true",
                order.order_id,
                jsonable(order.data),
                order.fingerprint,
                order.received_at,
                order.schema_version,
            )
            if not created:
                existing = await conn.fetchval(
                    f"SELECT fingerprint FROM {self._s}.orders WHERE order_id = $1",
                    order.order_id,
                )
                if existing != order.fingerprint:
                    return InsertOutcome.CONFLICT
            values = [_column_value(c, getattr(state, c)) for c in _STATE_COLUMNS]
            marks = ", ".join(f"${i}" for i in range(1, len(values) + 1))
            await conn.execute(
                f"INSERT INTO {self._s}.state ({', '.join(_STATE_COLUMNS)}) VALUES ({marks}) "
                "ON CONFLICT (order_id) DO NOTHING",
                *values,
            )
        return InsertOutcome.CREATED if created else InsertOutcome.EXISTS

    async def get_order(self, order_id: str) -> OrderRecord | None:
        row = await self._pool.fetchrow(
            f"SELECT * FROM {self._s}.orders WHERE order_id = $1", order_id
        )
        if row is None:
            return None
        return _order_from(row)

    async def get_orders(self, order_ids: Sequence[str]) -> list[OrderRecord | None]:
        rows = await self._pool.fetch(
            f"SELECT * FROM {self._s}.orders WHERE order_id = ANY($1::text[])", list(order_ids)
        )
        found = {row["order_id"]: _order_from(row) for row in rows}
        return [found.get(order_id) for order_id in order_ids]

    async def get_state(self, order_id: str) -> StateRecord | None:
        row = await self._pool.fetchrow(
            f"SELECT * FROM {self._s}.state WHERE order_id = $1", order_id
        )
        return None if row is None else state_from(dict(row))

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
        args: list[Any] = [order_id]

        def arg(value: Any) -> str:
            args.append(value)
            return f"${len(args)}"

        sets = [f"{name} = {arg(_column_value(name, v))}" for name, v in changes.fields.items()]
        if changes.steps:
            patch = {name: jsonable(step) for name, step in changes.steps.items()}
            sets.append(f"steps = steps || {arg(patch)}::jsonb")
        where = ["order_id = $1", *self._conditions(expect, arg)]
        update = (
            f"UPDATE {self._s}.state SET {', '.join(sets)} WHERE {' AND '.join(where)} RETURNING *"
        )
        if not history and compensation is None and undo is None:
            row = await self._pool.fetchrow(update, *args)
            return None if row is None else state_from(dict(row))
        # The bookkeeping rides along in the same statement, and only if the update matched.
        parts = [f"u AS ({update})"]
        if history:
            columns = list(zip(*(_history_row(e) for e in history), strict=True))
            parts.append(
                f"h AS (INSERT INTO {self._s}.history "
                "(order_id, type, at, attempt, instance_id, step, data, schema_version) "
                f"SELECT o, t, a, n, i, p, d::jsonb, v FROM unnest("
                f"{arg(list(columns[0]))}::text[], {arg(list(columns[1]))}::text[], "
                f"{arg(list(columns[2]))}::timestamptz[], {arg(list(columns[3]))}::int[], "
                f"{arg(list(columns[4]))}::text[], {arg(list(columns[5]))}::text[], "
                f"{arg(list(columns[6]))}::text[], {arg(list(columns[7]))}::int[]) "
                "WITH ORDINALITY AS x(o, t, a, n, i, p, d, v, k) "
                "WHERE EXISTS (SELECT 1 FROM u) ORDER BY k)"
            )
        if compensation is not None:
            c = compensation
            parts.append(
                f"c AS (INSERT INTO {self._s}.compensation_log (order_id, step, undo, "
                "idempotency_key, recorded_at, status, done_at, error, schema_version) "
                f"SELECT {arg(c.order_id)}, {arg(c.step)}, {arg(c.undo)}, "
                f"{arg(c.idempotency_key)}, {arg(c.recorded_at)}::timestamptz, "
                f"{arg(c.status.value)}, {arg(c.done_at)}::timestamptz, {arg(c.error)}::text, "
                f"{arg(c.schema_version)}::int "
                "WHERE EXISTS (SELECT 1 FROM u) ON CONFLICT (order_id, step) DO NOTHING)"
            )
        if undo is not None:
            parts.append(
                f"m AS (UPDATE {self._s}.compensation_log SET status = {arg(undo.status.value)}, "
                f"done_at = {arg(undo.at if undo.status is UndoStatus.DONE else None)}"
                f"::timestamptz, error = {arg(undo.error)}::text "
                f"WHERE order_id = $1 AND step = {arg(undo.step)} AND status <> 'Done' "
                "AND EXISTS (SELECT 1 FROM u))"
            )
        row = await self._pool.fetchrow(f"WITH {', '.join(parts)} SELECT * FROM u", *args)
        return None if row is None else state_from(dict(row))

    @staticmethod
    def _conditions(expect: Expect, arg: Any) -> list[str]:
        where = []
        if expect.process_state is not ANY:
            where.append(f"process_state = ANY({arg([s.value for s in expect.process_state])})")
        for name in ("locked_by", "complete_by"):
            value = getattr(expect, name)
            if value is None:
                where.append(f"{name} IS NULL")
            elif value is not ANY:
                where.append(f"{name} = {arg(value)}")
        if expect.updated_at is not ANY:
            where.append(f"updated_at = {arg(expect.updated_at)}")
        return where

    async def claim(
        self,
        *,
        now: datetime,
        limit: int,
        owner: str,
        complete_by: datetime,
        compensating: bool = False,
    ) -> list[StateRecord]:
        source, target = (
            ("Compensating", "Compensating") if compensating else ("Pending", "Processing")
        )
        # One round trip for a whole batch; SKIP LOCKED lets concurrent claimers pass each
        # other by instead of queueing on the same rows.
        statement = f"""
            UPDATE {self._s}.state AS s
               SET process_state = '{target}', attempt = s.attempt + 1,
                   locked_by = s.order_id || ':' || (s.attempt + 1), owner = $3,
                   complete_by = $4, updated_at = $1
              FROM (SELECT order_id FROM {self._s}.state
                     WHERE process_state = '{source}' AND locked_by IS NULL
                       AND next_attempt_at <= $1
                     ORDER BY next_attempt_at
                     LIMIT $2
                     FOR UPDATE SKIP LOCKED) AS due
             WHERE s.order_id = due.order_id
            RETURNING s.*
            """
        args = (now, limit, owner, complete_by)
        if not compensating and crash.armed("claim-uncommitted"):
            # The crash drill: the same statement in a transaction the process dies inside.
            async with self._pool.acquire() as conn, conn.transaction():
                rows = await conn.fetch(statement, *args)
                crash.crash_point("claim-uncommitted", len(rows))
        else:
            rows = await self._pool.fetch(statement, *args)
        return [state_from(dict(r)) for r in rows]

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

    # -- history
    async def append_history(self, event: HistoryEvent) -> None:
        await self.append_history_many([event])

    async def append_history_many(self, events: Sequence[HistoryEvent]) -> None:
        if not events:
            return
        await self._pool.executemany(
            f"INSERT INTO {self._s}.history "
            "(order_id, type, at, attempt, instance_id, step, data, schema_version)"
            " VALUES ($1, $2, $3, $4, $5, $6, $7::text::jsonb, $8)",
            [_history_row(e) for e in events],
        )

    async def read_history(self, order_id: str) -> list[HistoryEvent]:
        rows = await self._pool.fetch(
            f"SELECT * FROM {self._s}.history WHERE order_id = $1 ORDER BY seq", order_id
        )
        return [_read(HistoryEvent, r) for r in rows]

    # -- compensation log
    async def append_compensation(self, entry: CompensationEntry) -> bool:
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

    async def read_compensation(self, order_id: str) -> list[CompensationEntry]:
        rows = await self._pool.fetch(
            f"SELECT * FROM {self._s}.compensation_log WHERE order_id = $1 ORDER BY seq",
            order_id,
        )
        return [_read(CompensationEntry, r) for r in rows]

    # -- retention
    # Every purge picks its batch by `ctid` under row locks (`FOR UPDATE SKIP LOCKED`: a row a
    # consumer is changing right now is passed over, not waited for) in the order of an index
    # that matches its condition, and deletes through a TID scan: the plan reads what it
    # deletes, whatever the planner estimates (a join against a batch read whole tables).

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
        return _affected(result)

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

    # -- inbox
    async def inbox_claim(
        self, queue: str, message_id: str, *, holder: str, now: datetime, claim_until: datetime
    ) -> InboxOutcome:
        claim = InboxClaim(message_id, holder, claim_until)
        return (await self.inbox_claim_many(queue, [claim], now=now))[0]

    async def inbox_claim_many(
        self, queue: str, claims: Sequence[InboxClaim], *, now: datetime
    ) -> list[InboxOutcome]:
        first: dict[str, InboxClaim] = {}
        for claim in claims:
            first.setdefault(claim.message_id, claim)
        # One lock order for every batch: two consumers holding copies of the same messages
        # wait for each other instead of deadlocking.
        unique = sorted(first.values(), key=lambda c: c.message_id)
        # New, or expired (a dedupe window that passed, or a claim whose holder died): take it.
        rows = await self._pool.fetch(
            f"""
            INSERT INTO {self._s}.inbox AS i (queue, message_id, state, holder, expires_at)
            SELECT $1, m, 'processing', h, e
              FROM unnest($2::text[], $3::text[], $4::timestamptz[])
                   WITH ORDINALITY AS x(m, h, e, k)
             ORDER BY k
            ON CONFLICT (queue, message_id) DO UPDATE
               SET state = 'processing', holder = EXCLUDED.holder, expires_at = EXCLUDED.expires_at
             WHERE i.expires_at <= $5 OR (i.holder = EXCLUDED.holder AND i.state = 'processing')
            RETURNING message_id
            """,
            queue,
            [c.message_id for c in unique],
            [c.holder for c in unique],
            [c.claim_until for c in unique],
            now,
        )
        taken = {r["message_id"] for r in rows}
        # Rare (a duplicate, or a copy being handled elsewhere): one primary-key read each.
        states = {
            c.message_id: await self._pool.fetchval(
                f"SELECT state FROM {self._s}.inbox WHERE queue = $1 AND message_id = $2",
                queue,
                c.message_id,
            )
            for c in unique
            if c.message_id not in taken
        }

        def outcome(claim: InboxClaim) -> InboxOutcome:
            head = first[claim.message_id]
            if claim.message_id in taken:
                # A later copy of the id by another holder in the same batch finds it taken,
                # as it would a moment later.
                mine = head is claim or head.holder == claim.holder
                return InboxOutcome.CLAIMED if mine else InboxOutcome.BUSY
            done = states.get(claim.message_id) == "done"
            return InboxOutcome.DUPLICATE if done else InboxOutcome.BUSY

        return [outcome(c) for c in claims]

    async def inbox_complete(
        self, queue: str, message_id: str, *, holder: str, keep_until: datetime
    ) -> bool:
        result = await self._pool.execute(
            _INBOX_COMPLETE.format(s=self._s), queue, message_id, holder, keep_until
        )
        return _affected(result) == 1

    async def inbox_complete_many(self, queue: str, done: Sequence[InboxDone]) -> None:
        # One round trip (asyncpg pipelines the executions) of the one-row statement, whose
        # every plan is a primary-key lookup. A join against the batch was tried: its plan,
        # cached while the table was small, read the queue's whole inbox each time.
        await self._pool.executemany(
            _INBOX_COMPLETE.format(s=self._s),
            [(queue, d.message_id, d.holder, d.keep_until) for d in done],
        )

    async def inbox_release(self, queue: str, message_id: str, *, holder: str) -> bool:
        result = await self._pool.execute(
            f"DELETE FROM {self._s}.inbox WHERE queue = $1 AND message_id = $2 AND holder = $3 "
            "AND state = 'processing'",
            queue,
            message_id,
            holder,
        )
        return _affected(result) == 1

    async def inbox_purge(self, *, now: datetime, limit: int) -> int:
        # Oldest expiry first through `inbox_expiry`, as every purge (see purge_journal); an
        # entry a consumer is claiming right now (its row locked) is skipped, not waited for.
        result = await self._pool.execute(
            f"DELETE FROM {self._s}.inbox WHERE ctid = ANY(ARRAY(SELECT ctid FROM {self._s}.inbox "
            "WHERE expires_at <= $1 ORDER BY expires_at LIMIT $2 FOR UPDATE SKIP LOCKED))",
            now,
            limit,
        )
        return _affected(result)

    # -- lease
    async def lease_acquire(
        self, name: str, *, holder: str, now: datetime, expires_at: datetime
    ) -> bool:
        got = await self._pool.fetchval(
            f"""
            INSERT INTO {self._s}.lease AS l VALUES ($1, $2, $3, $4)
            ON CONFLICT (name) DO UPDATE
               SET holder = EXCLUDED.holder, expires_at = EXCLUDED.expires_at,
                   acquired_at = CASE WHEN l.holder = EXCLUDED.holder AND l.expires_at > $4
                                      THEN l.acquired_at ELSE EXCLUDED.acquired_at END
             WHERE l.holder = EXCLUDED.holder OR l.expires_at <= $4
            RETURNING true
            """,
            name,
            holder,
            expires_at,
            now,
        )
        return bool(got)

    async def lease_renew(
        self, name: str, *, holder: str, now: datetime, expires_at: datetime
    ) -> bool:
        result = await self._pool.execute(
            f"UPDATE {self._s}.lease SET expires_at = $3 "
            "WHERE name = $1 AND holder = $2 AND expires_at > $4",
            name,
            holder,
            expires_at,
            now,
        )
        return _affected(result) == 1

    async def lease_release(self, name: str, *, holder: str) -> bool:
        result = await self._pool.execute(
            f"DELETE FROM {self._s}.lease WHERE name = $1 AND holder = $2", name, holder
        )
        return _affected(result) == 1

    async def lease_get(self, name: str) -> Lease | None:
        row = await self._pool.fetchrow(f"SELECT * FROM {self._s}.lease WHERE name = $1", name)
        return None if row is None else _read(Lease, row)

    # -- alerts
    async def raise_alert(self, alert: Alert) -> bool:
        created = await self._pool.fetchval(
            f"INSERT INTO {self._s}.alerts (alert_id, kind, severity, message, at, order_id, "
            "source, data, schema_version) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) "
            "ON CONFLICT (alert_id) DO NOTHING RETURNING true",
            alert.alert_id,
            alert.kind.value,
            alert.severity.value,
            alert.message,
            alert.at,
            alert.order_id,
            alert.source,
            jsonable(alert.data),
            alert.schema_version,
        )
        return bool(created)

    async def list_alerts(self, *, since: datetime | None = None, limit: int = 100) -> list[Alert]:
        rows = await self._pool.fetch(
            f"SELECT * FROM {self._s}.alerts WHERE ($1::timestamptz IS NULL OR at >= $1) "
            "ORDER BY at DESC, alert_id LIMIT $2",
            since,
            limit,
        )
        return [_read(Alert, r) for r in rows]

    # -- component status
    async def report_status(self, status: ComponentStatus) -> None:
        await self._pool.execute(
            f"INSERT INTO {self._s}.components VALUES ($1, $2, $3, $4, $5) "
            "ON CONFLICT (name) DO UPDATE SET kind = EXCLUDED.kind, at = EXCLUDED.at, "
            "expires_at = EXCLUDED.expires_at, data = EXCLUDED.data",
            status.name,
            status.kind,
            status.at,
            status.expires_at,
            jsonable(status.data),
        )

    async def list_status(self, *, now: datetime) -> list[ComponentStatus]:
        await self._pool.execute(
            f"DELETE FROM {self._s}.components WHERE expires_at < $1", now - _STATUS_KEPT
        )
        rows = await self._pool.fetch(
            f"SELECT * FROM {self._s}.components WHERE expires_at > $1 ORDER BY kind, name", now
        )
        return [_read(ComponentStatus, r) for r in rows]

    async def forget_status(self, name: str) -> None:
        await self._pool.execute(f"DELETE FROM {self._s}.components WHERE name = $1", name)


_FINISHED = ", ".join(f"'{state.value}'" for state in sorted(TERMINAL_STATES))
"""The finished states as SQL literals, as the partial index `state_finished` names them (a
parameter could not be proven to match its predicate)."""

_STATUS_KEPT = timedelta(hours=1)
"""Expired statuses are pruned after this (a listing ignores them at once)."""


def _history_row(e: HistoryEvent) -> tuple[Any, ...]:
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


async def _reset_connection(connection: asyncpg.Connection) -> None:
    """What a connection needs before it goes back to the pool. The store opens no cursors,
    listens to nothing, takes no advisory locks and sets no session variables, so asyncpg's
    default reset (a round trip of four statements on every release, ~15% of a scheduler's
    CPU) is replaced by ending a transaction that was left open, if any."""
    if connection.is_in_transaction():
        await connection.execute("ROLLBACK")


_INBOX_COMPLETE = (
    # An upsert: the purge may have deleted a claim that expired while its message was
    # handled, and the dedupe record must be written anyway; an entry another holder took
    # since stays theirs.
    "INSERT INTO {s}.inbox AS i (queue, message_id, state, holder, expires_at) "
    "VALUES ($1, $2, 'done', $3, $4) ON CONFLICT (queue, message_id) DO UPDATE "
    "SET state = 'done', expires_at = EXCLUDED.expires_at WHERE i.holder = EXCLUDED.holder"
)


def _affected(status: str) -> int:
    """asyncpg returns a command tag such as 'UPDATE 1'."""
    return int(status.rsplit(" ", 1)[-1])


M = TypeVar("M", bound=BaseModel)


def _read(model: type[M], row: asyncpg.Record) -> M:
    """A record as stored: read under the STORED context (its text is not re-judged)."""
    return model.model_validate(dict(row), strict=False, context=STORED)


def _order_from(row: asyncpg.Record) -> OrderRecord:
    doc = dict(row)
    del doc["order_id"]
    return OrderRecord.model_validate(doc, strict=False, context=STORED)
