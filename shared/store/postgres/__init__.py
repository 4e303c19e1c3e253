"""The PostgreSQL adapter of the state store, through asyncpg: one schema per task hub.

One class per part of the port, each in its module, all sharing the store's one pool:

| module            | part                                                   |
|-------------------|--------------------------------------------------------|
| `connection.py`   | the pool, the schema (`schema.sql`), health (`StoreAdmin`) |
| `states.py`       | insert, read, conditional update, claim (`OrderStates`) |
| `queries.py`      | scans, listings, counts (`StateQueries`)               |
| `journal.py`      | history, compensation log (`Journal`)                  |
| `inbox.py`        | MessageId dedupe (`Inbox`)                             |
| `coordination.py` | lease, alerts, component statuses                      |
| `tokens.py`       | API tokens, by digest (`ApiTokens`)                    |
| `retention.py`    | bounded purges, record counts (`Purges`)               |
"""

from __future__ import annotations

import asyncpg

from shared.store.postgres.connection import (
    REFUSED,
    UNAVAILABLE,
    PostgresAdmin,
    broken_connection,
    create_pool,
)
from shared.store.postgres.coordination import PostgresCoordination
from shared.store.postgres.inbox import PostgresInbox
from shared.store.postgres.journal import PostgresJournal
from shared.store.postgres.queries import PostgresQueries
from shared.store.postgres.retention import PostgresRetention
from shared.store.postgres.states import BeforeClaimCommit, PostgresStates
from shared.store.postgres.tokens import PostgresTokens
from shared.store.unavailable import translate_errors

__all__ = ["BeforeClaimCommit", "PostgresStore"]


async def _left_server(store: object, exc: BaseException) -> None:
    if isinstance(store, PostgresAdmin):
        await store.left_server(exc)


@translate_errors(
    "PostgreSQL",
    unavailable=UNAVAILABLE,
    refused=REFUSED,
    outage=broken_connection,
    on_outage=_left_server,
)
class PostgresStore(
    PostgresAdmin,
    PostgresStates,
    PostgresQueries,
    PostgresJournal,
    PostgresInbox,
    PostgresCoordination,
    PostgresTokens,
    PostgresRetention,
):
    """State store on PostgreSQL: every part of the port over one pool and one schema."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        schema: str,
        *,
        before_claim_commit: BeforeClaimCommit | None = None,
    ) -> None:
        super().__init__(pool, schema)
        self._before_claim_commit = before_claim_commit

    @classmethod
    async def connect(
        cls,
        url: str,
        schema: str,
        *,
        pool_size: int,
        timeout: float,
        command_timeout: float,
        before_claim_commit: BeforeClaimCommit | None = None,
    ) -> PostgresStore:
        pool = await create_pool(
            url, pool_size=pool_size, timeout=timeout, command_timeout=command_timeout
        )
        return cls(pool, schema, before_claim_commit=before_claim_commit)

    async def close(self) -> None:
        """Write the inbox completions still waiting for a claim
        (decision:completion-waits-for-claim-postgresql), then close."""
        await self._write_lingering()
        await super().close()
