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

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import asyncpg

MAX_BATCH = 100
"""Calls one round trip carries at most."""


@dataclass
class _Call:
    statement: str
    args: Sequence[Any]
    key: str
    future: asyncio.Future[asyncpg.Record | None] = field(repr=False)


class StatementBatches:
    def __init__(self, pool: asyncpg.Pool, *, max_batch: int = MAX_BATCH) -> None:
        self._pool = pool
        self._max_batch = max_batch
        self._waiting: list[_Call] = []
        self._flusher: asyncio.Task[None] | None = None

    async def fetchrow(self, statement: str, args: Sequence[Any], *, key: str) -> Any:
        """The statement's row for record `key` (None when it returned none), run with other
        calls of the same statement made meanwhile."""
        future: asyncio.Future[asyncpg.Record | None] = asyncio.get_running_loop().create_future()
        self._waiting.append(_Call(statement, args, key, future))
        if self._flusher is None:
            self._flusher = asyncio.create_task(self._run())
        return await future  # a cancelled caller's call may still go; its row is dropped

    def _next_batch(self) -> list[_Call]:
        """The waiting calls of the first one's statement, in order, each unless its record is
        in the batch already or in a call of that statement left waiting."""
        statement = self._waiting[0].statement
        batch: list[_Call] = []
        later: list[_Call] = []
        keys: set[str] = set()
        for call in self._waiting:
            if call.statement != statement or call.key in keys or len(batch) >= self._max_batch:
                later.append(call)
                if call.statement == statement:
                    keys.add(call.key)
                continue
            batch.append(call)
            keys.add(call.key)
        self._waiting = later
        return sorted(batch, key=lambda c: c.key)

    async def _run(self) -> None:
        try:
            while self._waiting:
                await self._settle(self._next_batch())
        except asyncio.CancelledError:
            for call in self._waiting:
                call.future.cancel()
            self._waiting.clear()
            raise
        finally:
            self._flusher = None

    async def _settle(self, batch: list[_Call]) -> None:
        try:
            if len(batch) == 1:
                call = batch[0]
                _settle_one(call, await self._pool.fetchrow(call.statement, *call.args))
                return
            rows = await self._pool.fetchmany(batch[0].statement, [c.args for c in batch])
        except asyncio.CancelledError:
            _cancel(batch)
            raise
        except Exception as exc:
            if len(batch) == 1:
                _fail(batch[0], exc)
                return
            await self._one_by_one(batch)
            return
        by_key = {row["order_id"]: row for row in rows}
        for call in batch:
            _settle_one(call, by_key.get(call.key))

    async def _one_by_one(self, batch: list[_Call]) -> None:
        """After a round trip failed (it wrote nothing: one transaction): each call alone, so
        each gets its own row or error."""
        for call in batch:
            try:
                row = await self._pool.fetchrow(call.statement, *call.args)
            except asyncio.CancelledError:
                _cancel(batch)
                raise
            except Exception as exc:
                _fail(call, exc)
            else:
                _settle_one(call, row)


def _settle_one(call: _Call, row: asyncpg.Record | None) -> None:
    if not call.future.done():
        call.future.set_result(row)


def _fail(call: _Call, exc: Exception) -> None:
    if not call.future.done():
        call.future.set_exception(exc)


def _cancel(batch: list[_Call]) -> None:
    for call in batch:
        if not call.future.done():
            call.future.cancel()
