"""A PostgreSQL store that closes writes the inbox completions it holds back
(decision:completion-waits-for-claim-postgresql),
whether or not their callers still wait.

The pool here is a stand-in with asyncpg's one trait that matters: once closing, it refuses new
work. (The contract case in tests/contract/test_store_journal.py runs the same on the real
server, where a graceful close lets a write that already holds a connection finish, so the
ordering below cannot be forced there.)"""

from __future__ import annotations

import asyncio
import contextlib
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from shared.store.postgres.inbox import PostgresInbox
from shared.store.values import InboxClaim, InboxDone


class ClosingPool:
    def __init__(self) -> None:
        self.closing = False
        self.written: list[tuple[str, str]] = []

    async def fetch(
        self, _sql: str, queues: list[str], ids: list[str], states: list[str], *_: Any
    ) -> list[dict[str, str]]:
        if self.closing:
            raise RuntimeError("pool is closing")
        await asyncio.sleep(0.01)  # the round trip
        self.written += list(zip(ids, states, strict=True))
        return [
            {"queue": q, "message_id": m, "state": s}
            for q, m, s in zip(queues, ids, states, strict=True)
        ]

    async def fetchval(self, *_: Any) -> None:
        return None

    async def close(self) -> None:
        self.closing = True


@pytest.mark.parametrize("caller", ["waiting", "gone"])
async def test_closing_writes_the_completions_held_back(caller: str) -> None:
    pool = ClosingPool()
    inbox = PostgresInbox(pool, "s")  # type: ignore[arg-type]
    now = datetime.now(UTC)
    until = now + timedelta(seconds=30)
    await inbox.inbox_claim_many("q", [InboxClaim("a", "h1", until)], now=now)
    completing = asyncio.create_task(inbox.inbox_complete_many("q", [InboxDone("a", "h1", until)]))
    await asyncio.sleep(0)
    assert inbox._lingering, "the completion waits for a claim"
    if caller == "gone":
        completing.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await completing
    await inbox._write_lingering()
    await pool.close()
    if caller == "waiting":
        await asyncio.wait_for(completing, 2.0)
    assert pool.written == [("a", "processing"), ("a", "done")]
