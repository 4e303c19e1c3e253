"""Choosing the store adapter from the settings: the only place that knows them all."""

from __future__ import annotations

from typing import TYPE_CHECKING

from shared import crash
from shared.config import Settings
from shared.store.port import StateStore

if TYPE_CHECKING:
    from shared.store.postgres import BeforeClaimCommit


async def open_store(settings: Settings) -> StateStore:
    """Connect to the store `ORDERFLOW_STORE_URL` names, in the hub's schema or database.
    Only its adapter is imported: a process on PostgreSQL never loads PyMongo, nor the other
    way round."""
    url, hub = settings.store.store_url, settings.hub
    pool_size, timeout = settings.store.store_pool_size, settings.process.connect_timeout_s
    command_timeout = settings.store.store_command_timeout_s
    if settings.store.store_kind != "postgresql":
        from shared.store.mongo import MongoStore  # noqa: PLC0415 - only its own adapter

        return await MongoStore.connect(
            url, hub, pool_size=pool_size, timeout=timeout, command_timeout=command_timeout
        )
    from shared.store.postgres import PostgresStore  # noqa: PLC0415 - only its own adapter

    return await PostgresStore.connect(
        url,
        hub,
        pool_size=pool_size,
        timeout=timeout,
        command_timeout=command_timeout,
        before_claim_commit=claim_drill(settings),
    )


def claim_drill(settings: Settings) -> BeforeClaimCommit | None:
    """The crash drill's hook in a PostgreSQL claim, when the settings ask for it.

    Only for `claim-uncommitted`: the claim then runs in a transaction, and the hook exits the
    process inside it once the scheduler armed the drill (`crash.arm`, as it starts) and its
    count is reached; in any other process it does nothing. Otherwise there is no hook and a
    claim is one autocommitted statement, as in production."""
    if settings.drills.fault_crash_at != "claim-uncommitted":
        return None
    return crash.claim_uncommitted
