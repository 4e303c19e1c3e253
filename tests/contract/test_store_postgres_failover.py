"""The PostgreSQL store on a multi-host URL: it connects to the host that takes writes, and
follows the writes when they move (issue 19).

libpq's form, `postgresql://user@h1:p1,h2:p2/db?target_session_attrs=read-write`, is parsed and
honoured by asyncpg itself. What the store adds: a write refused because the server became
read-only is an outage (retried), not a bug, and it drops the pool's connections to that server
and the arrival watch's session on it, so that the next ones go to the new primary.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator

import asyncpg
import pytest

from harness.nemesis.servers import ReplicatedPostgres, free_port
from shared.errors import ServerMissing, ServiceUnavailable, StoreUnavailable
from shared.store.postgres import PostgresStore
from tests.conftest import POSTGRES_URL, service_missing
from tests.support.factories import order_pair
from tests.support.waiting import eventually

pytestmark = pytest.mark.postgres


async def _connect(url: str, hub: str) -> PostgresStore:
    return await PostgresStore.connect(url, hub, pool_size=3, timeout=5, command_timeout=10)


async def test_a_host_that_is_down_is_skipped_for_the_next_one(hub: str) -> None:
    host = POSTGRES_URL.split("@", 1)[1]  # 127.0.0.1:5432/test
    url = f"postgresql://postgres@127.0.0.1:{free_port()},{host}?target_session_attrs=read-write"
    try:
        store = await _connect(url, hub)
    except Exception as exc:
        service_missing("PostgreSQL", exc)
    try:
        await store.init()
        await store.insert_order(*order_pair("o-multi-host"))
        assert await store.get_state("o-multi-host") is not None
    finally:
        await store.drop()
        await store.close()


async def test_no_host_that_takes_writes_is_unavailable_not_a_configuration_error(
    hub: str,
) -> None:
    url = f"postgresql://postgres@127.0.0.1:{free_port()},127.0.0.1:{free_port()}/x"
    with pytest.raises(ServiceUnavailable, match=r"127\.0\.0\.1:\d+,127\.0\.0\.1:\d+"):
        await _connect(url, hub)


@pytest.fixture(scope="module")
def pair() -> Iterator[ReplicatedPostgres]:
    # Asynchronous: here the old primary lives on while the standby is promoted, and a
    # synchronous one would wait for ever for the standby it lost.
    try:
        servers = ReplicatedPostgres(synchronous=False)
    except ServerMissing as exc:
        service_missing("a private PostgreSQL primary and standby", exc)
    with servers:
        yield servers


@pytest.fixture
async def standby_first(pair: ReplicatedPostgres, hub: str) -> AsyncIterator[PostgresStore]:
    # The standby listed first: target_session_attrs=read-write must pass it over.
    primary, standby = pair.primary.port, pair.standby.port
    url = (
        f"postgresql://postgres@127.0.0.1:{standby},127.0.0.1:{primary}/{pair.primary.database}"
        "?target_session_attrs=read-write"
    )
    store = await _connect(url, hub)
    await store.init()
    yield store
    await store.close()


async def test_a_standby_alone_is_no_primary_to_start_on(
    pair: ReplicatedPostgres, hub: str
) -> None:
    url = (
        f"postgresql://postgres@127.0.0.1:{pair.standby.port}/{pair.primary.database}"
        "?target_session_attrs=read-write"
    )
    with pytest.raises(ServiceUnavailable, match="None of the hosts match"):
        await _connect(url, hub)


async def _server_port(store: PostgresStore) -> int:
    port: int = await store._pool.fetchval("SELECT inet_server_port()")
    return port


async def test_a_primary_made_read_only_is_left_for_the_promoted_standby(
    pair: ReplicatedPostgres, standby_first: PostgresStore, hub: str
) -> None:
    store = standby_first
    assert await _server_port(store) == pair.primary.port
    woken = asyncio.Event()
    watch = await store.watch_arrivals(woken.set)
    try:
        await store.insert_order(*order_pair("o-before"))  # a second session, kept in the pool
        # The primary stops taking writes (what a demotion does to the sessions it keeps)
        # while its standby is not promoted yet.
        await asyncio.to_thread(
            pair.primary.sql,
            "ALTER SYSTEM SET default_transaction_read_only = on",
            "SELECT pg_reload_conf()",
        )
        refused: list[StoreUnavailable] = []

        async def a_write_refused() -> bool:
            try:
                await store.insert_order(*order_pair(f"o-during-{len(refused)}"))
            except StoreUnavailable as exc:
                refused.append(exc)
                return True
            return False  # written before the old primary's session read the new setting

        await eventually(a_write_refused, timeout=10, what="a write refused as read-only")
        assert "read-only transaction" in str(refused[0])
        assert not watch.alive, "the watch still listens on the server the store left"
        # Neither host takes writes: still an outage, the store's own words.
        with pytest.raises(StoreUnavailable, match="None of the hosts"):
            await store.insert_order(*order_pair("o-no-primary"))
    finally:
        await watch.close()

    await asyncio.to_thread(pair.standby.promote)
    # The next connections go to the new primary; writes and the arrival watch work there.
    assert await _server_port(store) == pair.standby.port
    again = await store.watch_arrivals(woken.set)
    try:
        woken.clear()
        await store.insert_order(*order_pair("o-after"))
        await asyncio.wait_for(woken.wait(), timeout=5)
    finally:
        await again.close()
    on_new_primary = await asyncpg.connect(
        f"postgresql://postgres@127.0.0.1:{pair.standby.port}/{pair.primary.database}"
    )
    try:
        found = await on_new_primary.fetchval(
            f'SELECT count(*) FROM "{hub}".state WHERE order_id IN ($1, $2)', "o-before", "o-after"
        )
    finally:
        await on_new_primary.close()
    assert found == 2
