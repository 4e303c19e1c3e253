"""The PostgreSQL store when a server connection is lost under it.

A server that shuts down or restarts ends every session: the arrival watch's LISTEN session
among them. Found by the fault suite's PostgreSQL restart: the watch then asked its pooled
connection whether it was closed, the pool had already taken the lost connection back, and the
proxy's refusal (an `InterfaceError`) killed both schedulers.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import asyncpg
import pytest

from shared.errors import StoreUnavailable
from shared.store.postgres import PostgresStore
from shared.store.postgres.connection import broken_connection
from tests.conftest import POSTGRES_URL, service_missing
from tests.support.factories import order_pair
from tests.support.waiting import eventually

pytestmark = pytest.mark.postgres


@pytest.fixture
async def pg_store(hub: str) -> AsyncIterator[PostgresStore]:
    try:
        store = await PostgresStore.connect(
            POSTGRES_URL, hub, pool_size=3, timeout=5, command_timeout=10
        )
    except Exception as exc:
        service_missing("PostgreSQL", exc)
    await store.init()
    yield store
    await store.drop()
    await store.close()


async def _end_listening_sessions(channel: str) -> int:
    """End every server session that LISTENs on `channel`, as a server shutdown would."""
    admin = await asyncpg.connect(POSTGRES_URL)
    try:
        ended = await admin.fetch(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE pid <> pg_backend_pid() AND query = $1",
            f'LISTEN "{channel}"',
        )
    finally:
        await admin.close()
    return len(ended)


async def test_a_watch_whose_session_ends_says_it_is_dead_and_a_new_one_wakes(
    pg_store: PostgresStore, hub: str
) -> None:
    woken = asyncio.Event()
    watch = await pg_store.watch_arrivals(woken.set)
    assert watch.alive
    assert await _end_listening_sessions(f"{hub}.arrivals") == 1

    async def dead() -> bool:
        return not watch.alive  # never raises, whatever the pool did with the connection

    await eventually(dead, timeout=10, what="the watch knows its session ended")
    await watch.close()  # closing a dead watch is quiet
    assert not watch.alive

    again = await pg_store.watch_arrivals(woken.set)
    try:
        assert again.alive
        woken.clear()
        await pg_store.insert_order(*order_pair("o-after-loss"))
        await asyncio.wait_for(woken.wait(), timeout=5)
    finally:
        await again.close()
    # The store's pool serves on after the lost connection.
    assert await pg_store.get_state("o-after-loss") is not None


def test_a_connection_left_mid_protocol_is_an_outage_not_a_bug() -> None:
    # What asyncpg raises when it hands out a connection still consuming the error of a server
    # that is shutting down, once more before it sees the socket close.
    mid_protocol = asyncpg.InternalClientError(
        "cannot switch to state 12; another operation (2) is in progress"
    )
    assert broken_connection(mid_protocol)
    assert not broken_connection(asyncpg.InternalClientError("some other client bug"))
    assert not broken_connection(ValueError("another operation"))


async def test_the_store_reports_a_connection_left_mid_protocol_as_unavailable(
    pg_store: PostgresStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    class MidProtocol:
        async def fetchrow(self, *_: object) -> None:
            raise asyncpg.InternalClientError(
                "cannot switch to state 12; another operation (2) is in progress"
            )

    monkeypatch.setattr(pg_store, "_pool", MidProtocol())
    with pytest.raises(StoreUnavailable, match="another operation"):
        await pg_store.get_state("o-any")
