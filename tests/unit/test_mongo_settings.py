"""The MongoDB adapter's reading of its URL and of the server's errors, with PyMongo's own client
and exceptions (no server: building a client does not connect)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import pytest
from pymongo import ReadPreference
from pymongo.errors import (
    AutoReconnect,
    BulkWriteError,
    DuplicateKeyError,
    ExecutionTimeout,
    NetworkTimeout,
    NotPrimaryError,
    OperationFailure,
    ServerSelectionTimeoutError,
    WriteConcernError,
    WTimeoutError,
)

from shared.domain.journal import HistoryEvent, HistoryEventType
from shared.domain.timing import utcnow
from shared.errors import ConfigurationError
from shared.store.mongo import (
    MongoStore,
    client_for,
    database_for,
    hub_location,
    is_outage,
    retention,
)
from tests.support.mongo_standin import (
    APP_DATABASE,
    StandInClient,
    StandInServer,
    User,
    app_client,
    compose_server,
)

TIMEOUTS = {"pool_size": 2, "timeout": 0.5, "command_timeout": 1.0}


@pytest.mark.parametrize(
    "exc",
    [
        AutoReconnect("connection closed"),
        NetworkTimeout("timed out"),
        ServerSelectionTimeoutError("no primary"),
        NotPrimaryError("not primary", {"code": 10107}),
        ExecutionTimeout("operation exceeded time limit", 50),
        WTimeoutError("waiting for replication timed out", 64),
        WriteConcernError("shutdown in progress", 91),
        OperationFailure("ExceededTimeLimit", 262),
        OperationFailure("WriteConflict", 112),
        OperationFailure("LockTimeout", 24),
        OperationFailure("interrupted", 11602),
        OperationFailure("any", 1, {"errorLabels": ["RetryableWriteError"]}),
        BulkWriteError({"writeErrors": [], "writeConcernErrors": [{"code": 64}]}),
        BulkWriteError({"writeErrors": [{"code": 91}], "writeConcernErrors": []}),
    ],
    ids=repr,
)
def test_try_later_answers_are_outages(exc: BaseException) -> None:
    assert is_outage(exc)


@pytest.mark.parametrize(
    "exc",
    [
        DuplicateKeyError("E11000", 11000),
        OperationFailure("Unauthorized", 13),
        OperationFailure("AuthenticationFailed", 18),
        OperationFailure("BadValue", 2),
        OperationFailure("IndexOptionsConflict", 85),
        BulkWriteError({"writeErrors": [{"code": 11000}], "writeConcernErrors": []}),
        BulkWriteError({"writeErrors": [{"code": 2}], "writeConcernErrors": [{"code": 64}]}),
        ValueError("not a driver error"),
    ],
    ids=repr,
)
def test_refusals_and_mistakes_are_not_outages(exc: BaseException) -> None:
    assert not is_outage(exc)


async def test_retryable_writes_are_on_unless_the_url_says_otherwise() -> None:
    on = await client_for("mongodb://127.0.0.1:1/orderflow", **TIMEOUTS)
    off = await client_for("mongodb://127.0.0.1:1/orderflow?retryWrites=false", **TIMEOUTS)
    try:
        assert on.options.retry_writes is True and on.options.retry_reads is True
        assert off.options.retry_writes is False  # the URL's own choice, not overridden
    finally:
        await on.close()
        await off.close()


async def test_reads_go_to_the_primary_whatever_the_url_prefers() -> None:
    url = "mongodb://127.0.0.1:1/orderflow?readPreference=secondaryPreferred"
    client = await client_for(url, **TIMEOUTS)
    try:
        assert client.read_preference != ReadPreference.PRIMARY  # what the URL asked
        db, prefix = database_for(client, "orderflow")
        assert db.read_preference == ReadPreference.PRIMARY
        assert (db.name, prefix) == ("orderflow", "")
    finally:
        await client.close()


@pytest.mark.parametrize(
    ("url", "kept"),
    [
        ("mongodb://127.0.0.1:1/orderflow", {}),
        ("mongodb://127.0.0.1:1/orderflow?w=majority&readConcernLevel=majority", {}),
        (
            "mongodb://127.0.0.1:1/orderflow?wtimeoutMS=2000&journal=true",
            {"wtimeout": 2000, "j": True},
        ),
    ],
)
async def test_the_store_writes_and_reads_with_a_majority(url: str, kept: dict[str, Any]) -> None:
    """Issue 35: an acknowledgement a failover can take back breaks the fences, so the store's
    database waits for a majority and reads a majority's, whatever the URL leaves out (and keeps
    its write timeout and journal choice)."""
    client = await client_for(url, **TIMEOUTS)
    try:
        db, _ = database_for(client, "orderflow")
        for concerned in (db, db["state"]):
            assert concerned.write_concern.document == {"w": "majority"} | kept
            assert concerned.read_concern.level == "majority"
    finally:
        await client.close()


async def test_the_stand_in_is_asked_for_a_majority_too() -> None:
    """The stand-in has no replicas: it records what the adapter asked of its database, and no
    run on it says anything of what a majority does."""
    store = await MongoStore.open(StandInClient(StandInServer()), "orderflow")
    try:
        options = store._db.options
        assert options["write_concern"].document == {"w": "majority"}
        assert options["read_concern"].level == "majority"
    finally:
        await store.close()


@pytest.mark.parametrize(
    ("url", "said"),
    [
        ("mongodb://127.0.0.1:1/orderflow?w=1", "w=1"),
        ("mongodb://127.0.0.1:1/orderflow?w=2", "w=2"),
        ("mongodb://127.0.0.1:1/orderflow?readConcernLevel=local", "readconcernlevel=local"),
        ("mongodb://127.0.0.1:1/orderflow?readConcernLevel=available", "readconcernlevel=avail"),
        ("mongodb://127.0.0.1:1/orderflow?w=0", "w=0"),
        ("mongodb://127.0.0.1:1/?tls=true&tlsCAFile=/nonexistent/ca.pem", "tlscafile"),
        ("mongodb://127.0.0.1:1/?readPreference=nearest-ish", "readpreference"),
        ("mongodb://user:secret@127.0.0.1:1/?authMechanism=NOPE", "authmechanism"),
        ("mongodb://127.0.0.1:1/?retryWritse=false", "retrywritse"),
    ],
)
async def test_urls_no_retry_could_fix_are_configuration_errors(url: str, said: str) -> None:
    with pytest.raises(ConfigurationError) as raised:
        await client_for(url, **TIMEOUTS)
    assert said in str(raised.value).lower()
    assert "secret" not in str(raised.value)


@pytest.mark.parametrize(
    ("database", "hub", "where"),
    [
        ("orderflow", "orderflow", ("orderflow", "")),
        ("orderflow", "bench12ab", ("orderflow", "bench12ab.")),
        (None, "shop", ("shop", "")),
        ("admin", "shop", ("shop", "")),
    ],
)
def test_a_hub_lives_in_the_urls_database(
    database: str | None, hub: str, where: tuple[str, str]
) -> None:
    client = StandInClient(compose_server(), database=database)
    assert hub_location(client, hub) == where


# -- a server with the compose deployment's users (the stand-in; NOT MongoDB)


@pytest.fixture
async def app_store() -> AsyncIterator[MongoStore]:
    store = await MongoStore.open(app_client(compose_server()), "bench0001")
    yield store
    await store.close()


async def test_a_wrong_password_is_a_configuration_error_at_once() -> None:
    client = app_client(compose_server(), password="wrong")
    with pytest.raises(ConfigurationError, match="credentials"):
        await MongoStore.open(client, "orderflow")
    assert client.closed


async def test_a_user_without_a_role_on_the_database_is_told_so_at_once() -> None:
    server = compose_server()
    server.users[("other", "visitor")] = User("pw", [("readWrite", "other")])
    client = StandInClient(
        server, username="visitor", password="pw", auth_source="other", database=APP_DATABASE
    )
    with pytest.raises(ConfigurationError, match="may not read database orderflow"):
        await MongoStore.open(client, "orderflow")


async def test_a_hub_of_its_own_database_is_refused_to_the_app_user() -> None:
    """Why the hubs live in the URL's database: the app user may write that one only."""
    client = StandInClient(
        compose_server(), username="orderflow", password="app-password", auth_source="orderflow"
    )
    with pytest.raises(ConfigurationError, match="not authorized"):
        await MongoStore.open(client, "bench0001")


async def test_the_app_user_runs_a_benchmark_hub_beside_the_deployments(
    app_store: MongoStore,
) -> None:
    server = app_store._client.server
    deployment = await MongoStore.open(app_client(server), "orderflow")
    await deployment.init()
    await app_store.init()
    from tests.support.factories import order_pair

    for store, order_id in ((deployment, "o-kept"), (app_store, "o-bench")):
        order, state = order_pair(order_id)
        await store.insert_order(order, state)
    await app_store.purge_orders(finished_before=utcnow(), limit=10)
    assert (await app_store.record_counts())["orders"] == 1
    await app_store.drop()  # dropping collections, never the database (no dropDatabase role)
    assert await deployment.get_order("o-kept") is not None
    assert (await app_store.record_counts())["orders"] == 0
    names = server.mm[APP_DATABASE].list_collection_names()
    assert not [n for n in names if n.startswith("bench0001.")]
    await deployment.close()


async def test_a_journal_purge_reads_a_bounded_part_of_the_journal_each_round(
    app_store: MongoStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Parked orders' journals are passed over once a sweep, not re-read every round."""
    monkeypatch.setattr(retention, "PURGE_PAGE", 5)
    monkeypatch.setattr(retention, "PURGE_PAGES", 2)
    from tests.support.factories import order_pair

    await app_store.init()
    t0 = utcnow() - timedelta(hours=2)
    for n in range(8):  # parked: its journal is kept
        order, state = order_pair(f"o-live-{n}")
        await app_store.insert_order(order, state)
        events = [
            HistoryEvent(order_id=f"o-live-{n}", type=HistoryEventType.STEP_SCHEDULED, at=t0)
        ] * 5
        await app_store.append_history_many(events)
    server: Any = app_store._client.server
    reads = []
    for _ in range(6):
        before = server.commands["find"]
        await app_store.purge_journal(finished_before=utcnow(), limit=100)
        reads.append(server.commands["find"] - before)
    # 40 entries, 5 a page, 2 pages a round: a sweep takes 4 rounds, each reading its pages
    # (and the states of the orders on them), never the whole journal.
    assert max(reads) <= 2 * 2 * 2 + 2, reads


def test_the_cli_says_a_store_url_no_retry_could_fix_in_one_line() -> None:
    env = {
        "ORDERFLOW_STORE_URL": "mongodb://127.0.0.1:1/orderflow?tls=true&tlsCAFile=/nonexistent",
        "ORDERFLOW_HUB": "orderflow",
        "PATH": "/usr/bin:/bin",
    }
    done = subprocess.run(
        [sys.executable, "-m", "services.cli", "orders", "list"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and "tlscafile" in done.stderr.lower(), done.stderr
