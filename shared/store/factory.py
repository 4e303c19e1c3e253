"""Choosing the store adapter from the store's settings: the only place that knows them all."""

from __future__ import annotations

from typing import TYPE_CHECKING

from shared.config import StoreSettings
from shared.store.port import StateStore

if TYPE_CHECKING:
    from shared.store.postgres import BeforeClaimCommit


async def open_store(
    settings: StoreSettings,
    hub: str,
    *,
    connect_timeout_s: float,
    before_claim_commit: BeforeClaimCommit | None = None,
    initialising: bool = False,
) -> StateStore:
    """Connect to the store `ORDERFLOW_STORE_URL` names, in the hub's schema or database.
    Only its adapter is imported: a process on PostgreSQL never loads PyMongo, nor the other
    way round. `before_claim_commit`: a drill's hook in a PostgreSQL claim (the bootstrap's
    choice, `shared.bootstrap.claim_drill`); None, as in production, makes a claim one
    autocommitted statement. `initialising`: for `orderflow init`, which brings an older
    release's store to this one's layout (every other caller is refused such a store)."""
    url, pool_size = settings.store_url, settings.store_pool_size
    command_timeout = settings.store_command_timeout_s
    if settings.store_kind != "postgresql":
        from shared.store.mongo import MongoStore  # noqa: PLC0415 - only its own adapter

        return await MongoStore.connect(
            url,
            hub,
            pool_size=pool_size,
            timeout=connect_timeout_s,
            command_timeout=command_timeout,
            initialising=initialising,
        )
    from shared.store.postgres import PostgresStore  # noqa: PLC0415 - only its own adapter

    return await PostgresStore.connect(
        url,
        hub,
        pool_size=pool_size,
        timeout=connect_timeout_s,
        command_timeout=command_timeout,
        before_claim_commit=before_claim_commit,
    )
