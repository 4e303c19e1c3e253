"""What the store's PostgreSQL database says of a run: the transactions it ran."""

from __future__ import annotations

from typing import Any

import asyncpg

STATS_FLUSH_S = 11.0
"""A PostgreSQL backend that stays connected publishes its statistics at most once a second
while busy and 10 s after it goes idle (one that exits, at once)."""


async def store_transactions(url: str) -> int | None:
    """Transactions the store's PostgreSQL database has run so far (every statement the store
    sends outside an explicit transaction is one); None for another store, or when the count
    cannot be read."""
    if not url.startswith(("postgresql://", "postgres://")):
        return None
    try:
        connection = await asyncpg.connect(url, timeout=5)
    except (OSError, asyncpg.PostgresError, TimeoutError):
        return None
    try:
        # The server publishes its counters at most once a second: ask for a fresh snapshot.
        await connection.execute("SELECT pg_stat_clear_snapshot()")
        count = await connection.fetchval(
            "SELECT xact_commit + xact_rollback FROM pg_stat_database "
            "WHERE datname = current_database()"
        )
        return int(count) if count is not None else None
    finally:
        await connection.close()


async def with_transactions(
    result: dict[str, Any], before: int | None, store_url: str
) -> dict[str, Any]:
    """Add the store transactions per order since `before` (PostgreSQL only)."""
    if before is not None and (after := await store_transactions(store_url)) is not None:
        result["store_transactions_per_order"] = round(
            (after - before) / max(1, result["orders"]), 2
        )
    return result
