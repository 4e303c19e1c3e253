"""Contract: the MongoDB adapter's layout 2, an order's journal in its state record (
decision:mongodb-transition-one-write): bounded, and moved there from an older release's hub by
`orderflow init`.

Run on the in-process stand-in (`mongodb-standin`, NOT MongoDB) and, where
`ORDERFLOW_TEST_MONGODB_URL` names one, on a real server (`mongodb-real`).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from pymongo.errors import ServerSelectionTimeoutError

from shared.domain.journal import CompensationEntry, HistoryEvent, HistoryEventType, UndoStatus
from shared.domain.timing import utcnow
from shared.domain.updates import Changes, Expect
from shared.errors import ConfigurationError, ServiceUnavailable, StoreUnavailable
from shared.store.codec import plain
from shared.store.mongo import MongoStore
from shared.store.mongo import migration as migration_module
from shared.store.mongo.journal import HISTORY_KEPT
from shared.store.values import UndoMark
from tests.contract.test_store_mongodb_server import bare, fail_command, mongo
from tests.support.factories import order_pair, undo_entry
from tests.support.mongo_standin import StandInClient, app_client

__all__ = ["bare", "mongo"]  # the fixtures

H = HistoryEventType


async def test_an_orders_history_keeps_its_newest_events_with_their_numbers(
    mongo: MongoStore,
) -> None:
    await mongo.insert_order(*order_pair("o-long"))
    t = utcnow()
    events = [
        HistoryEvent(order_id="o-long", type=H.STEP_FAILED, at=t, attempt=i)
        for i in range(HISTORY_KEPT + 50)
    ]
    for i in range(0, len(events), 20):  # appended 20 at a time, the bound kept at each
        await mongo.append_history_many(events[i : i + 20])
    kept = await mongo.read_history("o-long")
    assert len(kept) == HISTORY_KEPT
    assert [e.attempt for e in kept] == list(range(50, HISTORY_KEPT + 50))
    assert [e.seq for e in kept] == list(range(51, HISTORY_KEPT + 51)), "numbers kept"


async def _old_hub(store: MongoStore, orders: int) -> dict[str, Any]:
    """A hub as the release before layout 2 left it: state records without their journal, the
    history and the undo log in collections of their own, a shared sequence in `counters`."""
    t = utcnow() - timedelta(hours=1)
    seq = 0
    for n in range(orders):
        order_id = f"o-old-{n:04}"
        order, state = order_pair(order_id)
        await store._named("orders").insert_one(plain(order) | {"_id": order_id})
        await store._state.insert_one(plain(state) | {"_id": order_id})
        events = [
            HistoryEvent(order_id=order_id, type=H.ORDER_SUBMITTED, at=t),
            HistoryEvent(order_id=order_id, type=H.STEP_SCHEDULED, at=t, step="reserve"),
        ]
        await store._named("history").insert_many([plain(e) for e in events])
        seq += 1
        undo = CompensationEntry(
            order_id=order_id,
            step="reserve",
            undo="inventory.release",
            idempotency_key=f"{order_id}:reserve:undo",
            recorded_at=t,
            seq=seq,
        )
        await store._named("compensation_log").insert_one(
            plain(undo) | {"_id": f"{order_id}|reserve"}
        )
    await store._named("counters").insert_one({"_id": "compensation_log", "value": seq})
    # An orphan event (its order never recorded) goes with the old collections.
    orphan = HistoryEvent(order_id="o-never", type=H.ORDER_SUBMITTED, at=t)
    await store._named("history").insert_one(plain(orphan))
    return {"at": t}


async def _journals(store: MongoStore, orders: int) -> list[tuple[list[Any], list[Any]]]:
    found = []
    for n in range(orders):
        history = await store.read_history(f"o-old-{n:04}")
        undos = await store.read_compensation(f"o-old-{n:04}")
        found.append(([(e.type, e.step, e.seq) for e in history], [u.step for u in undos]))
    return found


MOVED = ([(H.ORDER_SUBMITTED, None, 1), (H.STEP_SCHEDULED, "reserve", 2)], ["reserve"])


async def test_init_moves_an_old_hubs_journal_into_its_records_once(
    bare: MongoStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(migration_module, "BATCH", 7)  # several batches, the last one short
    await _old_hub(bare, 30)
    await bare.init()
    assert await _journals(bare, 30) == [MOVED] * 30
    names = set(await bare._db.list_collection_names())
    assert not {f"{bare._prefix}{n}" for n in ("history", "compensation_log", "counters")} & names
    # Idempotent: nothing left to move, nothing moved twice.
    assert await bare.migrate_journal() == 0
    await bare.init()
    assert await _journals(bare, 30) == [MOVED] * 30


async def test_an_interrupted_move_goes_on_where_it_stopped(
    bare: MongoStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(migration_module, "BATCH", 5)
    await _old_hub(bare, 20)
    await bare._create_indexes()
    # The server goes away after the second batch's write.
    async with fail_command(bare, {"skip": 2}, failCommands=["update"], errorCode=91):
        with pytest.raises(StoreUnavailable):
            await bare.migrate_journal()
    moved = await bare._state.count_documents({"layout": 2})
    assert moved == 10, "each batch moved whole, and only the two before the failure"
    assert await bare.migrate_journal() == 10
    assert await _journals(bare, 20) == [MOVED] * 20


async def test_what_the_new_release_wrote_before_init_is_kept_after_the_old_journal(
    bare: MongoStore,
) -> None:
    await _old_hub(bare, 1)
    await bare._create_indexes()
    # A process of the new release, started before `orderflow init`, appends an event and logs
    # the undo of a step the old log does not have.
    later = utcnow()
    event = HistoryEvent(order_id="o-old-0000", type=H.STEP_COMPLETED, at=later, step="reserve")
    undo = undo_entry("o-old-0000", "charge", at=later)
    changes = Changes(fields={"updated_at": later})
    assert await bare.update_state("o-old-0000", Expect(), changes, history=[event]) is not None
    assert await bare.update_state("o-old-0000", Expect(), changes, compensation=undo)
    assert await bare.migrate_journal() == 1
    [(history, undos)] = await _journals(bare, 1)
    assert history == [*MOVED[0], (H.STEP_COMPLETED, "reserve", 3)]
    assert undos == ["reserve", "charge"]
    # The moved undo log takes its outcomes, Done final, as one written by this release.
    mark = UndoMark("reserve", UndoStatus.DONE, later)
    assert await bare.update_state("o-old-0000", Expect(), changes, undo=mark)
    assert [u.status for u in await bare.read_compensation("o-old-0000")] == [
        UndoStatus.DONE,
        UndoStatus.PENDING,
    ]


async def test_an_index_build_held_by_a_member_that_is_down_is_said_plainly(
    bare: MongoStore,
) -> None:
    async with fail_command(bare, "alwaysOn", failCommands=["createIndexes"], errorCode=50):
        with pytest.raises(ServiceUnavailable, match="every voting member") as raised:
            await bare.init()
    assert "bring the member back" in str(raised.value)


async def test_a_server_gone_during_init_is_an_outage_not_a_held_index_build(
    bare: MongoStore,
) -> None:
    """Only a createIndexes that ran out of the server's time is blamed on a member that is
    down (review): a connection lost, or a server not found, is an outage like any other (both
    are PyMongo timeouts, which the first version of the message took for a held build)."""
    async with fail_command(bare, "alwaysOn", failCommands=["createIndexes"], closeConnection=True):
        with pytest.raises(ServiceUnavailable) as raised:
            await bare.init()
    assert "voting member" not in str(raised.value)

    async def unreachable() -> None:
        raise ServerSelectionTimeoutError("stand-in:27017: [Errno 111] Connection refused")

    bare._create_indexes = unreachable  # type: ignore[method-assign]
    with pytest.raises(ServiceUnavailable) as raised:
        await bare.init()
    assert "voting member" not in str(raised.value)


async def test_a_transition_with_its_journal_is_one_command_and_no_counter(
    mongo: MongoStore,
) -> None:
    """Issue 35, hazards 1 and 4: the state, its events and its undo in one write; no shared
    counter document every undo log once incremented (a hotspot under load)."""
    client = mongo._client
    if not isinstance(client, StandInClient):
        pytest.skip("counts the stand-in's commands")
    await mongo.insert_order(*order_pair("o-one"))
    t = utcnow()
    event = HistoryEvent(order_id="o-one", type=H.STEP_SCHEDULED, at=t, step="reserve")
    undo = undo_entry("o-one", "reserve", at=t)
    client.server.trips.clear()
    changes = Changes(fields={"locked_by": "o-one:1.abcdefgh", "updated_at": t})
    after = await mongo.update_state(
        "o-one", Expect(locked_by=None), changes, history=[event], compensation=undo
    )
    assert after is not None
    assert dict(client.server.trips) == {("findAndModify", f"{mongo._prefix}state"): 1}
    names = await mongo._db.list_collection_names()
    assert not [n for n in names if n.endswith("counters")]


async def test_a_process_refuses_a_hub_init_has_not_moved_yet(
    bare: MongoStore, hub: str, mongodb_url: str | None
) -> None:
    """Issue 35 review: a process of this release on a record not moved would see no undo log
    and compensate nothing; it refuses to start until `orderflow init` moved the journal."""
    await _old_hub(bare, 2)
    client: Any = bare._client

    async def reopen(*, initialising: bool = False) -> MongoStore:
        if isinstance(client, StandInClient):
            return await MongoStore.open(app_client(client.server), hub, initialising=initialising)
        assert mongodb_url is not None
        timeouts = {"pool_size": 2, "timeout": 5.0, "command_timeout": 10.0}
        return await MongoStore.connect(mongodb_url, hub, initialising=initialising, **timeouts)

    with pytest.raises(ConfigurationError, match="orderflow init"):
        await reopen()
    initialising = await reopen(initialising=True)
    await initialising.init()
    await initialising.close()
    after = await reopen()
    assert await _journals(after, 2) == [MOVED] * 2
    await after.close()
