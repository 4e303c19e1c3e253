"""The store fixture: every contract case runs once per adapter.

- `postgresql`: the real PostgreSQL server.
- `mongodb-real`: a real MongoDB server, from `ORDERFLOW_TEST_MONGODB_URL` or a testcontainer where
  a Docker engine runs; skipped with the reason otherwise (never silently passed).
- `memory`: the reference adapter in memory (`shared/store/memory/`), the pure rules alone.
- `mongodb-standin`: the MongoDB adapter against the in-process stand-in (mongomock). NOT MongoDB.
  It logs in as the compose deployment's application user (`readWrite` on database `orderflow`
  only), so every case also checks that the adapter needs no more than that.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from shared.store.memory import MemoryStore
from shared.store.mongo import MongoStore
from shared.store.postgres import PostgresStore
from tests.conftest import MONGODB_URL, POSTGRES_URL, service_missing
from tests.support.broker_harness import broker
from tests.support.mongo_standin import app_client, compose_server
from tests.support.stores import StoreUnderTest

__all__ = ["broker"]  # the broker fixture, for every contract test

STORE_KINDS = [
    pytest.param("postgresql", marks=pytest.mark.postgres, id="postgresql"),
    pytest.param("mongodb-real", marks=pytest.mark.mongodb_real, id="mongodb-real"),
    pytest.param("mongodb-standin", marks=pytest.mark.mongodb_standin, id="mongodb-standin"),
    pytest.param("memory", marks=pytest.mark.memory, id="memory"),
]


def _docker_available() -> bool:
    try:
        import docker  # type: ignore[import-untyped]

        docker.from_env().ping()
    except Exception:
        return False
    return True


@pytest.fixture(scope="session")
def mongodb_url() -> Iterator[str | None]:
    """A real MongoDB server's URL, or None when there is none to be had."""
    if MONGODB_URL:
        yield MONGODB_URL
        return
    if not _docker_available():
        yield None
        return
    from testcontainers.mongodb import MongoDbContainer

    with MongoDbContainer("mongo:8.0") as container:
        yield container.get_connection_url()


async def _open(kind: str, hub: str, mongodb_url: str | None) -> StoreUnderTest:
    common: dict[str, Any] = {"pool_size": 30, "timeout": 5.0, "command_timeout": 10.0}
    if kind == "postgresql":
        try:
            return await PostgresStore.connect(POSTGRES_URL, hub, **common)
        except Exception as exc:
            service_missing("PostgreSQL", exc)
    if kind == "mongodb-real":
        if mongodb_url is None:
            pytest.skip(
                "no real MongoDB server: set ORDERFLOW_TEST_MONGODB_URL or run a Docker engine; "
                "the MongoDB adapter ran against the in-process stand-in instead (mongodb-standin)"
            )
        return await MongoStore.connect(mongodb_url, hub, **common)
    if kind == "memory":
        return MemoryStore()
    # As the compose deployment's application user: readWrite on its database only, which
    # holds this test's hub under the prefix `<hub>.`.
    return await MongoStore.open(app_client(compose_server()), hub)


@pytest.fixture(params=STORE_KINDS)
async def store(
    request: pytest.FixtureRequest, hub: str, mongodb_url: str | None
) -> AsyncIterator[StoreUnderTest]:
    s = await _open(request.param, hub, mongodb_url)
    await s.init()
    try:
        yield s
    finally:
        await asyncio.wait_for(s.drop(), 10)
        await s.close()
