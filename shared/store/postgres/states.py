"""Order and state records on PostgreSQL: insert, read, update, claim (`OrderStates`)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

import asyncpg
from asyncpg.pool import PoolConnectionProxy

from shared.domain.claims import claim_for
from shared.domain.journal import CompensationEntry, HistoryEvent, UndoStatus
from shared.domain.models import OrderRecord, StateRecord
from shared.domain.transitions import Action
from shared.domain.updates import ANY, Changes, Expect
from shared.store.codec import jsonable, state_from
from shared.store.port import ArrivalWatch
from shared.store.postgres.connection import (
    STATE_COLUMNS,
    STATE_TYPES,
    PostgresPart,
    column_value,
    order_from,
)
from shared.store.postgres.journal import history_row
from shared.store.values import InsertOutcome, UndoMark

Arg = Callable[[Any], str]
"""Adds a statement parameter and names it (`$n`)."""

BeforeClaimCommit = Callable[[Action, int], None]
"""Called inside a claim's transaction before it commits, with the claim's action (`claim` or
`claim-compensation`) and how many records it claimed."""


class PostgresStates(PostgresPart):
    _before_claim_commit: BeforeClaimCommit | None = None
    """Given, a claim runs in a transaction of its own and this is called before its commit
    (the scheduler's crash drill dies there); without it, a claim is one autocommitted
    statement."""

    async def insert_order(
        self, order: OrderRecord, state: StateRecord, *, history: Sequence[HistoryEvent] = ()
    ) -> InsertOutcome:
        # One statement: the order if absent; its state record if the order is new or is the
        # same order (a crash between the two writes of an earlier try left it without one);
        # the history of a new order; and a notification to the arrival watchers when a state
        # record was inserted. Its snapshot is taken before it runs, so an order inserted
        # concurrently by another statement is seen by neither `o` nor `f`: that rare case
        # goes the long way (`_insert_order_again`).
        args: list[Any] = []

        def arg(value: Any) -> str:
            args.append(value)
            return f"${len(args)}"

        o = (
            f"o AS (INSERT INTO {self._s}.orders VALUES ({arg(order.order_id)}, "
            f"{arg(jsonable(order.data))}, {arg(order.fingerprint)}, {arg(order.received_at)}, "
            f"{arg(order.schema_version)}) ON CONFLICT (order_id) DO NOTHING RETURNING true)"
        )
        f = f"f AS (SELECT fingerprint FROM {self._s}.orders WHERE order_id = $1)"
        values = ", ".join(
            f"{arg(column_value(c, getattr(state, c)))}::{STATE_TYPES[c]}" for c in STATE_COLUMNS
        )
        st = (
            f"st AS (INSERT INTO {self._s}.state ({', '.join(STATE_COLUMNS)}) SELECT {values} "
            "WHERE EXISTS (SELECT 1 FROM o) OR EXISTS (SELECT 1 FROM f WHERE fingerprint = $3) "
            "ON CONFLICT (order_id) DO NOTHING RETURNING true)"
        )
        parts = [o, f, st]
        if history:
            parts.append(self._history_part(history, arg, guard="o"))
        parts.append(
            f"n AS (SELECT pg_notify({arg(self._arrivals)}, '') WHERE EXISTS (SELECT 1 FROM st))"
        )
        row = await self._batches.fetchrow(
            f"WITH {', '.join(parts)} SELECT $1::text AS order_id, "
            "EXISTS (SELECT 1 FROM o) AS created, (SELECT fingerprint FROM f) AS existing, "
            "(SELECT count(*) FROM n) AS notified",
            args,
            key=order.order_id,
        )
        assert row is not None
        if row["created"]:
            return InsertOutcome.CREATED
        if row["existing"] is None:
            return await self._insert_order_again(order, state)
        if row["existing"] != order.fingerprint:
            return InsertOutcome.CONFLICT
        return InsertOutcome.EXISTS

    async def _insert_order_again(self, order: OrderRecord, state: StateRecord) -> InsertOutcome:
        """The order was inserted by a statement that ran beside ours: compare with it now, and
        complete the pair if it is the same order."""
        existing = await self._pool.fetchval(
            f"SELECT fingerprint FROM {self._s}.orders WHERE order_id = $1", order.order_id
        )
        if existing != order.fingerprint:
            return InsertOutcome.CONFLICT
        values = [column_value(c, getattr(state, c)) for c in STATE_COLUMNS]
        marks = ", ".join(f"${i}" for i in range(1, len(values) + 1))
        async with self._pool.acquire() as conn, conn.transaction():
            inserted = await conn.fetchval(
                f"INSERT INTO {self._s}.state ({', '.join(STATE_COLUMNS)}) VALUES ({marks}) "
                "ON CONFLICT (order_id) DO NOTHING RETURNING true",
                *values,
            )
            if inserted:
                await conn.execute("SELECT pg_notify($1, '')", self._arrivals)
        return InsertOutcome.EXISTS

    @property
    def _arrivals(self) -> str:
        """The notification channel of this hub's new state records."""
        return f"{self._schema}.arrivals"

    async def watch_arrivals(self, wake: Callable[[], None]) -> ArrivalWatch:
        # A connection of the pool kept for the watch: LISTEN lasts as long as its session.
        conn: PoolConnectionProxy = await self._pool.acquire()
        callback = _waker(wake)
        try:
            await conn.add_listener(self._arrivals, callback)
        except BaseException:
            await self._pool.release(conn)
            raise
        return _ListeningConnection(
            self._pool, conn, self._arrivals, callback, lambda: self._server_changes
        )

    async def get_order(self, order_id: str) -> OrderRecord | None:
        row = await self._pool.fetchrow(
            f"SELECT * FROM {self._s}.orders WHERE order_id = $1", order_id
        )
        if row is None:
            return None
        return order_from(row)

    async def get_orders(self, order_ids: Sequence[str]) -> list[OrderRecord | None]:
        rows = await self._pool.fetch(
            f"SELECT * FROM {self._s}.orders WHERE order_id = ANY($1::text[])", list(order_ids)
        )
        found = {row["order_id"]: order_from(row) for row in rows}
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

        sets = [f"{name} = {arg(column_value(name, v))}" for name, v in changes.fields.items()]
        if changes.steps:
            patch = {name: jsonable(step) for name, step in changes.steps.items()}
            sets.append(f"steps = steps || {arg(patch)}::jsonb")
        where = ["order_id = $1", *conditions(expect, arg)]
        update = (
            f"UPDATE {self._s}.state SET {', '.join(sets)} WHERE {' AND '.join(where)} RETURNING *"
        )
        # The bookkeeping rides along in the same statement, and only if the update matched.
        parts = [f"u AS ({update})"]
        if history:
            parts.append(self._history_part(history, arg))
        if compensation is not None:
            parts.append(self._compensation_part(compensation, arg))
        if undo is not None:
            parts.append(self._undo_part(undo, arg))
        statement = update if len(parts) == 1 else f"WITH {', '.join(parts)} SELECT * FROM u"
        row = await self._batches.fetchrow(statement, args, key=order_id)
        return None if row is None else state_from(dict(row))

    def _history_part(self, history: Sequence[HistoryEvent], arg: Arg, *, guard: str = "u") -> str:
        columns = list(zip(*(history_row(e) for e in history), strict=True))
        return (
            f"h AS (INSERT INTO {self._s}.history "
            "(order_id, type, at, attempt, instance_id, step, data, schema_version) "
            f"SELECT o, t, a, n, i, p, d::jsonb, v FROM unnest("
            f"{arg(list(columns[0]))}::text[], {arg(list(columns[1]))}::text[], "
            f"{arg(list(columns[2]))}::timestamptz[], {arg(list(columns[3]))}::int[], "
            f"{arg(list(columns[4]))}::text[], {arg(list(columns[5]))}::text[], "
            f"{arg(list(columns[6]))}::text[], {arg(list(columns[7]))}::int[]) "
            "WITH ORDINALITY AS x(o, t, a, n, i, p, d, v, k) "
            f"WHERE EXISTS (SELECT 1 FROM {guard}) ORDER BY k)"
        )

    def _compensation_part(self, c: CompensationEntry, arg: Arg) -> str:
        return (
            f"c AS (INSERT INTO {self._s}.compensation_log (order_id, step, undo, "
            "idempotency_key, recorded_at, status, done_at, error, schema_version) "
            f"SELECT {arg(c.order_id)}, {arg(c.step)}, {arg(c.undo)}, "
            f"{arg(c.idempotency_key)}, {arg(c.recorded_at)}::timestamptz, "
            f"{arg(c.status.value)}, {arg(c.done_at)}::timestamptz, {arg(c.error)}::text, "
            f"{arg(c.schema_version)}::int "
            "WHERE EXISTS (SELECT 1 FROM u) ON CONFLICT (order_id, step) DO NOTHING)"
        )

    def _undo_part(self, undo: UndoMark, arg: Arg) -> str:
        return (
            f"m AS (UPDATE {self._s}.compensation_log SET status = {arg(undo.status.value)}, "
            f"done_at = {arg(undo.at if undo.status is UndoStatus.DONE else None)}"
            f"::timestamptz, error = {arg(undo.error)}::text "
            f"WHERE order_id = $1 AND step = {arg(undo.step)} AND status <> 'Done' "
            "AND EXISTS (SELECT 1 FROM u))"
        )

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
        args: list[Any] = []

        def arg(value: Any) -> str:
            args.append(value)
            return f"${len(args)}"

        sets = [f"{name} = {arg(column_value(name, v))}" for name, v in spec.fields.items()]
        # The source state as a literal: the partial indexes `state_claimable` and
        # `state_compensation_claimable` serve only a query whose condition provably implies
        # theirs, and a parameter's value is not known when the plan is made.
        where = conditions(spec.expect, arg, literal_states=True)
        # One round trip for a whole batch; SKIP LOCKED lets concurrent claimers pass each
        # other by instead of queueing on the same rows. The attempt and its lock are
        # `Claim.changes` in SQL: attempt + 1, and `<order_id>:<attempt>.<nonce>` with the
        # claim's nonce (`instance_id`).
        statement = f"""
            UPDATE {self._s}.state AS s
               SET {", ".join(sets)}, attempt = s.attempt + 1,
                   locked_by = s.order_id || ':' || (s.attempt + 1) || '.'
                               || {arg(spec.nonce)}::text
              FROM (SELECT order_id FROM {self._s}.state
                     WHERE {" AND ".join(where)}
                     ORDER BY next_attempt_at
                     LIMIT {arg(spec.limit)}
                     FOR UPDATE SKIP LOCKED) AS due
             WHERE s.order_id = due.order_id
            RETURNING s.*
            """
        if started_by is not None:
            # Each claimed record's ExecutionStarted, in the same statement: its attempt and
            # lock from the row, the rest as every one of the batch has it.
            _, kind, at, _, _, _, data, version = history_row(spec.started("x", 0, by=started_by))
            statement = f"""
                WITH c AS ({statement}),
                     h AS (INSERT INTO {self._s}.history
                           (order_id, type, at, attempt, instance_id, step, data, schema_version)
                           SELECT order_id, {arg(kind)}, {arg(at)}::timestamptz, attempt,
                                  locked_by, NULL, {arg(data)}::text::jsonb, {arg(version)}::int
                             FROM c ORDER BY order_id)
                SELECT * FROM c
                """
        hook = self._before_claim_commit
        if hook is None:
            rows = await self._pool.fetch(statement, *args)
        else:
            async with self._pool.acquire() as conn, conn.transaction():
                rows = await conn.fetch(statement, *args)
                hook(spec.action, len(rows))
        return [state_from(dict(r)) for r in rows]


def conditions(expect: Expect, arg: Arg, *, literal_states: bool = False) -> list[str]:
    """An `Expect` as SQL conditions, its values as parameters (the states as literals, when
    asked: they are our enum's values, never input)."""
    where = []
    if expect.process_state is not ANY:
        names = sorted(s.value for s in expect.process_state)
        listed = ", ".join(f"'{name}'" for name in names)
        where.append(
            f"process_state IN ({listed})"
            if literal_states
            else f"process_state = ANY({arg(names)})"
        )
    for name in ("locked_by", "complete_by"):
        value = getattr(expect, name)
        if value is None:
            where.append(f"{name} IS NULL")
        elif value is not ANY:
            where.append(f"{name} = {arg(value)}")
    if expect.updated_at is not ANY:
        where.append(f"updated_at = {arg(expect.updated_at)}")
    if expect.due_by is not ANY:
        where.append(f"next_attempt_at <= {arg(expect.due_by)}")
    return where


def _waker(wake: Callable[[], None]) -> Callable[..., None]:
    def on_notification(*_: object) -> None:
        wake()

    return on_notification


class _ListeningConnection:
    """An `ArrivalWatch` on PostgreSQL: a pooled connection that LISTENs until closed."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        conn: PoolConnectionProxy,
        channel: str,
        callback: Callable[..., None],
        server_changes: Callable[[], int],
    ) -> None:
        self._pool = pool
        self._conn = conn
        self._channel = channel
        self._callback = callback
        self._server_changes = server_changes
        self._changes_at_start = server_changes()
        self._closed = False

    @property
    def alive(self) -> bool:
        if self._closed:
            return False
        if self._server_changes() != self._changes_at_start:
            # The store left this server (it stopped taking writes): the new primary's
            # notifications reach only a session on it.
            return False
        try:
            return not self._conn.is_closed()
        except asyncpg.InterfaceError:
            # A pooled connection that was lost goes back to its pool at once, and the proxy
            # this watch holds refuses every call from then on: the watch is dead.
            return False

    @property
    def tells(self) -> bool:
        return True

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(Exception):
            # UNLISTEN before the connection serves anyone else.
            await self._conn.remove_listener(self._channel, self._callback)
        with contextlib.suppress(Exception):
            await self._pool.release(self._conn)
