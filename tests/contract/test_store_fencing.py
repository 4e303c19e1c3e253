"""A fencing token is never issued twice, rollback or not (issue 35, item 3).

A claim's write that a failover rolls back takes `attempt` back with it, so the next claim numbers
its attempt the same as the one taken back, whose holder may still be acting. The two attempts
must still carry different tokens (shared/domain/identity.py: the claim's nonce). The rollback
here happens below the adapter, as a failover's would: the record is put back whole, as it was
before the claim, through each adapter's own raw access.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import timedelta

from shared.domain.identity import parse_instance_id
from shared.domain.models import StateRecord
from shared.domain.timing import utcnow
from shared.domain.updates import Changes, Expect
from shared.store.memory import MemoryStore
from shared.store.mongo import MongoStore
from shared.store.postgres import PostgresStore
from tests.support.factories import order_pair
from tests.support.stores import StoreUnderTest

Restore = Callable[[], Awaitable[None]]


async def rollback_point(store: StoreUnderTest, order_id: str) -> Restore:
    """Put the order's state record back as it is now, when called: what a failover does to a
    write the new primary never had."""
    if isinstance(store, MemoryStore):
        record = store._states[order_id]

        async def restore_memory() -> None:
            store._states[order_id] = record

        return restore_memory
    if isinstance(store, PostgresStore):
        found = await store._pool.fetchrow(
            f"SELECT * FROM {store._s}.state WHERE order_id = $1", order_id
        )
        assert found is not None
        row = dict(found)
        columns = [c for c in row if c != "order_id"]
        sets = ", ".join(f"{c} = ${n}" for n, c in enumerate(columns, 2))

        async def restore_postgres() -> None:
            await store._pool.execute(
                f"UPDATE {store._s}.state SET {sets} WHERE order_id = $1",
                order_id,
                *(row[c] for c in columns),
            )

        return restore_postgres
    assert isinstance(store, MongoStore), type(store)
    doc = await store._state.find_one({"_id": order_id})
    assert doc is not None

    async def restore_mongo() -> None:
        await store._state.replace_one({"_id": order_id}, doc)

    return restore_mongo


async def claim(store: StoreUnderTest, order_id: str) -> StateRecord:
    now = utcnow()
    claimed = await store.claim(
        now=now, limit=10, owner="sched-a", complete_by=now + timedelta(seconds=30)
    )
    [record] = [r for r in claimed if r.order_id == order_id]
    return record


async def test_a_claim_rolled_back_and_made_again_issues_another_token(
    store: StoreUnderTest,
) -> None:
    order, state = order_pair("o-rollback")
    await store.insert_order(order, state)
    before_claim = await rollback_point(store, "o-rollback")

    first = await claim(store, "o-rollback")
    await before_claim()  # the claim's write is rolled back
    assert await store.get_state("o-rollback") == state
    second = await claim(store, "o-rollback")

    # The same attempt number, as the rollback took the first claim's back ...
    assert first.attempt == second.attempt == 1
    assert first.locked_by is not None and second.locked_by is not None
    assert parse_instance_id(first.locked_by) == parse_instance_id(second.locked_by)
    # ... but not the same fence.
    assert first.locked_by != second.locked_by

    # The first attempt, still acting on what it was told, writes nothing over the second.
    late = Changes(fields={"failure_count": 5, "updated_at": utcnow()})
    assert await store.update_state("o-rollback", Expect(locked_by=first.locked_by), late) is None
    assert await store.get_state("o-rollback") == second
