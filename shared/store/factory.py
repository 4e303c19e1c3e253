"""Choosing the store adapter from the settings: the only place that knows them all."""

from __future__ import annotations

from shared.config import Settings
from shared.store.mongo import MongoStore
from shared.store.port import StateStore
from shared.store.postgres import PostgresStore


async def open_store(settings: Settings) -> StateStore:
    """Connect to the store `ORDERFLOW_STORE_URL` names, in the hub's schema or database."""
    connect = PostgresStore.connect if settings.store_kind == "postgresql" else MongoStore.connect
    store: StateStore = await connect(
        settings.store_url,
        settings.hub,
        pool_size=settings.store_pool_size,
        timeout=settings.connect_timeout_s,
        command_timeout=settings.store_command_timeout_s,
    )
    return store
