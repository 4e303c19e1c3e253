"""Contract: the MongoDB adapter under what a real server does that a quiet one never shows.

Failovers, timeouts and write concerns not met (through MongoDB's `failCommand` fail point),
TTL deletions, index options that changed, and a user with `readWrite` on one database. Each case
runs on the in-process stand-in (`mongodb-standin`, NOT MongoDB) and, where
`ORDERFLOW_TEST_MONGODB_URL` names one, on a real server (`mongodb-real`; `failCommand` needs
`mongod --setParameter enableTestCommands=1`, and is skipped, saying so, without it).

A real server with retryable writes retries a failed write once by itself, and the server applies
it once: the cases assert what must hold either way, never that an error reached the adapter.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import pytest
from pymongo.errors import OperationFailure

from shared.config.connections import MAX_CLOCK_SKEW_S
from shared.domain.journal import HistoryEvent, HistoryEventType
from shared.domain.states import ProcessState
from shared.domain.timing import utcnow
from shared.domain.updates import Changes, Expect, RecoveryPolicy, recover
from shared.errors import ConfigurationError, StoreUnavailable
from shared.store.mongo import MongoStore
from shared.store.port import InboxOutcome, InsertOutcome
from tests.contract.conftest import _open
from tests.support.factories import order_pair, undo_entry
from tests.support.mongo_standin import StandInClient, root_client

MONGO_KINDS = [
    pytest.param("mongodb-real", marks=pytest.mark.mongodb_real, id="mongodb-real"),
    pytest.param("mongodb-standin", marks=pytest.mark.mongodb_standin, id="mongodb-standin"),
]


@pytest.fixture(params=MONGO_KINDS)
async def bare(
    request: pytest.FixtureRequest, hub: str, mongodb_url: str | None
) -> AsyncIterator[MongoStore]:
    """The hub's store, opened but not initialised (no indexes yet)."""
    store = await _open(request.param, hub, mongodb_url)
    assert isinstance(store, MongoStore)
    try:
        yield store
    finally:
        await store.drop()
        await store.close()


@pytest.fixture
async def mongo(bare: MongoStore) -> MongoStore:
    await bare.init()
    return bare


@contextlib.asynccontextmanager
async def fail_command(store: MongoStore, mode: Any, **data: Any) -> AsyncIterator[None]:
    """MongoDB's `failCommand` fail point, on while the block runs."""
    client = store._client
    admin = root_client(client.server).admin if isinstance(client, StandInClient) else client.admin
    try:
        await admin.command("configureFailPoint", "failCommand", mode=mode, data=data)
    except OperationFailure as exc:
        pytest.skip(
            "this server refuses the failCommand fail point (start mongod with "
            f"--setParameter enableTestCommands=1 to run this case): {exc}"
        )
    try:
        yield
    finally:
        await admin.command("configureFailPoint", "failCommand", mode="off")


TRY_LATER = [
    pytest.param({"errorCode": 10107}, id="NotWritablePrimary"),
    pytest.param({"errorCode": 11602}, id="InterruptedDueToReplStateChange"),
    pytest.param({"errorCode": 189}, id="PrimarySteppedDown"),
    pytest.param({"errorCode": 91}, id="ShutdownInProgress"),
    pytest.param({"errorCode": 50}, id="MaxTimeMSExpired"),
    pytest.param({"errorCode": 262}, id="ExceededTimeLimit"),
    pytest.param({"errorCode": 112}, id="WriteConflict"),
    pytest.param({"closeConnection": True}, id="connection-closed"),
    pytest.param({"writeConcernError": {"code": 64, "errmsg": "wtimeout"}}, id="WTimeout"),
    pytest.param({"writeConcernError": {"code": 91, "errmsg": "shutdown"}}, id="WCE-shutdown"),
]


@pytest.mark.parametrize("error", TRY_LATER)
async def test_every_try_later_answer_is_store_unavailable(
    mongo: MongoStore, error: dict[str, Any]
) -> None:
    order, state = order_pair("o-later")
    async with fail_command(mongo, "alwaysOn", failCommands=["insert"], **error):
        with pytest.raises(StoreUnavailable):
            await mongo.insert_order(order, state)
    # Once the server is back, the same write goes through (or finds its own earlier one).
    assert await mongo.insert_order(order, state) in {InsertOutcome.CREATED, InsertOutcome.EXISTS}
    assert await mongo.get_state("o-later") == state


@pytest.mark.parametrize("error", TRY_LATER[:3] + TRY_LATER[7:8])
async def test_a_read_during_a_failover_is_store_unavailable(
    mongo: MongoStore, error: dict[str, Any]
) -> None:
    order, state = order_pair("o-read")
    await mongo.insert_order(order, state)
    async with fail_command(mongo, "alwaysOn", failCommands=["find"], **error):
        with pytest.raises(StoreUnavailable):
            await mongo.get_state("o-read")
    assert await mongo.get_state("o-read") == state


async def _claimed(store: MongoStore, order_id: str) -> Any:
    order, state = order_pair(order_id)
    await store.insert_order(order, state)
    now = utcnow()
    [claimed] = await store.claim(
        now=now, limit=1, owner="sched-a", complete_by=now + timedelta(seconds=30)
    )
    return claimed


@pytest.mark.parametrize(
    "error",
    [
        pytest.param({"writeConcernError": {"code": 64, "errmsg": "wtimeout"}}, id="applied"),
        pytest.param({"errorCode": 10107}, id="not-applied"),
        pytest.param({"closeConnection": True}, id="connection-closed"),
    ],
)
async def test_an_update_whose_outcome_was_unknown_is_never_a_superseded_attempt(
    mongo: MongoStore, error: dict[str, Any]
) -> None:
    claimed = await _claimed(mongo, "o-unknown")
    # A write that changes what it expects (the lock): written twice, the second is refused.
    policy = RecoveryPolicy(failure_threshold=3, backoff=lambda n: timedelta(seconds=n))
    update = recover(claimed, now=claimed.complete_by + timedelta(seconds=1), policy=policy)
    event = HistoryEvent(order_id="o-unknown", type=HistoryEventType.RECOVERED, at=utcnow())
    write = ("o-unknown", update.expect, update.changes)
    async with fail_command(mongo, {"times": 1}, failCommands=["findAndModify"], **error):
        try:
            after = await mongo.update_state(*write, history=[event])
        except StoreUnavailable:
            # Not applied: the caller writes again, and that write is not refused.
            after = await mongo.update_state(*write, history=[event])
    assert after is not None, "the attempt's own write was reported as superseded"
    assert await mongo.get_state("o-unknown") == after
    assert after.process_state is ProcessState.PENDING and after.locked_by is None
    history = await mongo.read_history("o-unknown")
    assert [e.type for e in history] == [HistoryEventType.RECOVERED], "history not written once"


WRITES = ["findAndModify", "insert", "update"]


@pytest.mark.parametrize(
    "mode",
    [
        pytest.param({"times": 1}, id="first-write"),
        pytest.param({"skip": 1}, id="every-later-write"),
        pytest.param({"skip": 2}, id="every-write-after-two"),
    ],
)
async def test_a_transition_is_applied_whole_or_not_at_all_whichever_write_fails(
    mongo: MongoStore, mode: Any
) -> None:
    """Issue 35, hazard 2: a write concern not met on any write of a transition (it applied)
    never leaves the caller believing it was superseded, nor the record without its journal.
    The adapter once wrote the record, then its history and undo log: a failure of those
    raised, and the caller's retry, expecting what the record no longer was, matched nothing."""
    claimed = await _claimed(mongo, "o-whole")
    assert claimed.locked_by is not None
    t = utcnow()
    event = HistoryEvent(
        order_id="o-whole", type=HistoryEventType.STEP_SCHEDULED, at=t, step="reserve"
    )
    undo = undo_entry("o-whole", "reserve", at=t)
    # The caller expects the record as it read it: a retry after its own write matches nothing.
    expect = Expect(locked_by=claimed.locked_by, updated_at=claimed.updated_at)
    write = ("o-whole", expect, Changes(fields={"updated_at": t + timedelta(seconds=1)}))
    applied = {"writeConcernError": {"code": 64, "errmsg": "waiting for replication timed out"}}
    async with fail_command(mongo, mode, failCommands=WRITES, **applied):
        try:
            after = await mongo.update_state(*write, history=[event], compensation=undo)
        except StoreUnavailable:
            after = await mongo.update_state(*write, history=[event], compensation=undo)
    assert after is not None, "the transition's own write was reported as superseded"
    history = [e.type for e in await mongo.read_history("o-whole")]
    assert history.count(HistoryEventType.STEP_SCHEDULED) == 1, history
    assert [u.step for u in await mongo.read_compensation("o-whole")] == ["reserve"]


@pytest.mark.parametrize(
    ("mode", "error"),
    [
        pytest.param({"times": 2}, {"writeConcernError": {"code": 64}}, id="applied"),
        pytest.param({"times": 2}, {"errorCode": 189}, id="not-applied"),
        pytest.param("alwaysOn", {"writeConcernError": {"code": 64}}, id="all-applied"),
    ],
)
async def test_a_claim_returns_every_record_it_locked(
    mongo: MongoStore, mode: Any, error: dict[str, Any]
) -> None:
    for n in range(6):
        order, state = order_pair(f"o-claim-{n}")
        await mongo.insert_order(order, state)
    now = utcnow()
    async with fail_command(mongo, mode, failCommands=["findAndModify"], **error):
        try:
            claimed = await mongo.claim(
                now=now, limit=6, owner="sched-a", complete_by=now + timedelta(seconds=30)
            )
        except StoreUnavailable:
            claimed = []
    returned = {r.order_id for r in claimed}
    for n in range(6):
        record = await mongo.get_state(f"o-claim-{n}")
        assert record is not None
        if record.order_id in returned:
            assert record.process_state is ProcessState.PROCESSING
            assert record.owner == "sched-a"
        else:  # handed to no one, so it must be claimable again
            assert record.process_state is ProcessState.PENDING, record
            assert record.locked_by is None
    assert returned, "no record came back"


async def test_a_completion_after_the_ttl_monitor_deleted_its_claim_leaves_a_dedupe_record(
    mongo: MongoStore,
) -> None:
    now = utcnow()
    short = {"now": now, "claim_until": now + timedelta(seconds=1)}
    assert await mongo.inbox_claim("q", "m-ttl", holder="a", **short) is InboxOutcome.CLAIMED
    # The server's own TTL monitor (every 60 s), once the most skew allowed has passed too.
    later = now + timedelta(seconds=MAX_CLOCK_SKEW_S + 90)
    client = mongo._client
    if isinstance(client, StandInClient):
        assert client.server.ttl_pass(later) >= 1
    else:
        assert await mongo.inbox_purge(now=later, limit=10) == 1  # what the monitor would do
    assert await mongo.inbox_complete("q", "m-ttl", holder="a", keep_until=later + timedelta(1))
    claim = {"now": later, "claim_until": later + timedelta(seconds=30)}
    assert await mongo.inbox_claim("q", "m-ttl", holder="b", **claim) is InboxOutcome.DUPLICATE


async def test_the_ttl_monitor_never_deletes_a_live_claim_by_a_clock_ahead(
    bare: MongoStore,
) -> None:
    """The server's clock may be ahead of the processes' by as much as the settings allow; its
    TTL monitor once deleted an inbox claim as soon as that clock passed the claim's expiry,
    and another consumer could take the message while the first still handled it."""
    # An older release's index (expiry at once) goes with `init`.
    await bare._inbox.create_index("expires_at", name="inbox_expiry", expireAfterSeconds=0)
    await bare.init()
    await bare.init()  # and its absence is no error
    now = utcnow()
    claim = {"now": now, "claim_until": now + timedelta(seconds=30)}
    assert await bare.inbox_claim("q", "m-live", holder="a", **claim) is InboxOutcome.CLAIMED
    client = bare._client
    if not isinstance(client, StandInClient):
        pytest.skip("a real server's TTL monitor runs by its own clock, which a test cannot move")
    ahead = now + timedelta(seconds=30 + MAX_CLOCK_SKEW_S - 60)
    assert client.server.ttl_pass(ahead) == 0, "a live claim deleted by a clock ahead"
    later = {"now": now, "claim_until": now + timedelta(seconds=60)}
    assert await bare.inbox_claim("q", "m-live", holder="b", **later) is InboxOutcome.BUSY


@pytest.mark.parametrize(
    ("collection", "keys", "options"),
    [
        pytest.param("inbox", "expires_at", {"name": "inbox_expiry_late", "expireAfterSeconds": 5}),
        pytest.param("state", [("updated_at", 1)], {"name": "state_by_time"}, id="keys"),
        pytest.param(
            "state",
            [("next_attempt_at", 1)],
            {"name": "state_claimable", "partialFilterExpression": {"process_state": "Pending"}},
            id="partial-filter",
        ),
    ],
)
async def test_an_index_with_other_options_is_a_configuration_error(
    bare: MongoStore, collection: str, keys: Any, options: dict[str, Any]
) -> None:
    await bare._named(collection).create_index(keys, **options)
    with pytest.raises(ConfigurationError, match="dropIndex"):
        await bare.init()


class _MajorityLagging:
    """The orders collection as a majority read sees it while another copy's insert has not
    reached a majority yet: the document is on the primary, not in a majority's view."""

    def __init__(self, collection: Any) -> None:
        self._collection = collection

    def __getattr__(self, name: str) -> Any:
        return getattr(self._collection, name)

    async def find_one(self, *args: Any, **kwargs: Any) -> None:
        return None

    def with_options(self, **options: Any) -> Any:
        read_concern = options.get("read_concern")
        if read_concern is None or read_concern.level == "majority":
            return self
        return self._collection.with_options(**options)


async def test_a_copy_racing_the_first_insert_is_not_a_conflict(mongo: MongoStore) -> None:
    """Two copies of an order message recorded at once (submission has no inbox,
    decision:orders-deduped-by-order): the loser's duplicate-key read must not need a majority to
    see the winner's order."""
    order, state = order_pair("o-racing")
    assert await mongo.insert_order(order, state) is InsertOutcome.CREATED
    orders = mongo._orders
    mongo._orders = _MajorityLagging(orders)
    try:
        assert await mongo.insert_order(order, state) is InsertOutcome.EXISTS
        other, other_state = order_pair("o-racing", customer_id="someone-else")
        assert await mongo.insert_order(other, other_state) is InsertOutcome.CONFLICT
    finally:
        mongo._orders = orders
