"""The MongoDB adapter's whole-collection reads on the stand-in (NOT MongoDB): which commands
they send, and that none reads a whole collection in one command (issue 35, item 5)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from shared.domain.states import ProcessState
from shared.store.mongo import COLLECTIONS, MongoStore, queries
from tests.support.factories import order_pair
from tests.support.mongo_standin import app_client, compose_server


@pytest.fixture
async def app_store() -> AsyncIterator[MongoStore]:
    """A hub of the compose deployment's `orderflow` user (readWrite on its database only)."""
    store = await MongoStore.open(app_client(compose_server()), "scans")
    await store.init()
    yield store
    await store.close()


def _commands(store: MongoStore) -> Any:
    return store._client.server.commands  # type: ignore[attr-defined]


async def _orders(store: MongoStore, n: int, version: int = 1) -> None:
    for i in range(n):
        order, state = order_pair(f"o-{version}-{i}")
        await store.insert_order(order, state.model_copy(update={"workflow_version": version}))


async def test_record_counts_read_each_collections_metadata_not_its_documents(
    app_store: MongoStore,
) -> None:
    await _orders(app_store, 3)
    before = dict(_commands(app_store))
    counts = await app_store.record_counts()
    ran = {k: n - before.get(k, 0) for k, n in _commands(app_store).items()}
    assert (counts["orders"], counts["state"]) == (3, 3)
    assert {k: n for k, n in ran.items() if n} == {"count": len(COLLECTIONS)}


@pytest.mark.parametrize("records", [5, 4], ids=["a part page", "full pages"])
async def test_workflow_usage_groups_a_page_of_records_at_a_time(
    app_store: MongoStore, monkeypatch: pytest.MonkeyPatch, records: int
) -> None:
    monkeypatch.setattr(queries, "USAGE_PAGE", 2)
    await _orders(app_store, records - 1)
    await _orders(app_store, 1, version=2)
    before = _commands(app_store)["aggregate"]
    usage = {(u.workflow, u.version, u.state): u.count for u in await app_store.workflow_usage()}
    assert usage == {
        ("order", 1, ProcessState.PENDING): records - 1,
        ("order", 2, ProcessState.PENDING): 1,
    }
    # 2 records a command; a last full page is followed by one that finds none.
    assert _commands(app_store)["aggregate"] - before == records // 2 + 1
