"""Group commit of one-record statements on PostgreSQL.

A scheduler writes each of its orders four times or more, each write one statement on one
record; a submission process inserts each order with one statement. Sent one by one, every write
costs a round trip: a write to the socket that wakes a server process, and a commit. Here, calls
of the same statement made while a round trip is in flight go together in the next one, through
asyncpg's `fetchmany` (every execution in one message, one implicit transaction, one commit).
An idle process pays nothing: a call with none in flight goes at once, alone.

Each statement names the record it writes in its result's `order_id` column; no two calls of
one round trip write the same record (a second waits for the next round trip, so calls on one
record keep their order), and the calls go in order of their record, so two processes' round
trips lock records in one order and never deadlock. A round trip that fails is run again call
by call, so a call fails only for its own error.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import asyncpg

from shared.batching import GroupCommit

MAX_BATCH = 100
"""Calls one round trip carries at most."""


@dataclass(frozen=True)
class _Call:
    statement: str
    args: Sequence[Any]
    key: str


class StatementBatches:
    def __init__(self, pool: asyncpg.Pool, *, max_batch: int = MAX_BATCH) -> None:
        self._pool = pool
        self._calls: GroupCommit[_Call, asyncpg.Record | None] = GroupCommit(
            self._round_trip, max_batch=max_batch, select=_same_statement_other_records
        )

    async def fetchrow(self, statement: str, args: Sequence[Any], *, key: str) -> Any:
        """The statement's row for record `key` (None when it returned none), run with other
        calls of the same statement made meanwhile."""
        return await self._calls.submit(_Call(statement, args, key))

    async def _round_trip(
        self, calls: Sequence[_Call]
    ) -> Sequence[asyncpg.Record | Exception | None]:
        if len(calls) == 1:
            return [await self._pool.fetchrow(calls[0].statement, *calls[0].args)]
        try:
            rows = await self._pool.fetchmany(calls[0].statement, [c.args for c in calls])
        except Exception:
            # It wrote nothing (one transaction): each call alone, for its own row or error.
            return [await self._alone(call) for call in calls]
        by_key = {row["order_id"]: row for row in rows}
        return [by_key.get(call.key) for call in calls]

    async def _alone(self, call: _Call) -> asyncpg.Record | Exception | None:
        try:
            row: asyncpg.Record | None = await self._pool.fetchrow(call.statement, *call.args)
        except Exception as exc:
            return exc
        return row


def _same_statement_other_records(waiting: Sequence[_Call], max_batch: int) -> list[int]:
    """The waiting calls of the first one's statement, each unless its record is in the batch
    already or in a call of that statement left waiting, in order of their record."""
    statement = waiting[0].statement
    chosen: list[int] = []
    keys: set[str] = set()
    for i, call in enumerate(waiting):
        if call.statement != statement:
            continue
        if call.key not in keys and len(chosen) < max_batch:
            chosen.append(i)
        keys.add(call.key)
    return sorted(chosen, key=lambda i: waiting[i].key)
