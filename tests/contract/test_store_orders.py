"""Contract: orders, state records and conditional updates, for every store adapter."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import timedelta

import pytest

from shared.domain.claims import claim_for
from shared.domain.identity import nonce_of, parse_instance_id
from shared.domain.journal import HistoryEvent
from shared.domain.journal import HistoryEventType as H
from shared.domain.models import ErrorInfo, OrderRecord, StateRecord
from shared.domain.states import ErrorKind, ProcessState, StepStatus
from shared.domain.timing import utcnow
from shared.domain.updates import (
    ANY,
    Changes,
    Expect,
    RecoveryPolicy,
    apply,
    complete_step,
    matches,
    recover,
    start_step,
)
from shared.domain.workflow import ORDER_WORKFLOW
from shared.errors import StoreRefused
from shared.store.port import InsertOutcome, ListCursor, StateQuery, StateStore
from shared.store.postgres import PostgresStore
from tests.conftest import POSTGRES_URL
from tests.support.factories import order_pair

PROCESSING = frozenset({ProcessState.PROCESSING})
POLICY = RecoveryPolicy(failure_threshold=3, backoff=lambda n: timedelta(seconds=n))


async def claim_one(store: StateStore, order_id: str, *, timeout: float = 10.0):
    now = utcnow()
    claimed = await store.claim(
        now=now, limit=10, owner="sched-a", complete_by=now + timedelta(seconds=timeout)
    )
    return next(r for r in claimed if r.order_id == order_id)


async def test_insert_is_idempotent_and_never_overwrites(store: StateStore) -> None:
    order, state = order_pair("o-1")
    assert await store.insert_order(order, state) is InsertOutcome.CREATED
    assert await store.insert_order(order, state) is InsertOutcome.EXISTS

    other, other_state = order_pair("o-1", customer_id="someone-else")
    assert await store.insert_order(other, other_state) is InsertOutcome.CONFLICT
    stored = await store.get_order("o-1")
    assert stored == order
    assert stored.data.customer_id == "c-42"


async def test_insert_writes_the_history_of_a_new_order_only(store: StateStore) -> None:
    order, state = order_pair("o-hist")
    first = HistoryEvent(order_id="o-hist", type=H.ORDER_SUBMITTED, at=utcnow(), data={"n": 1})
    again = HistoryEvent(order_id="o-hist", type=H.ORDER_SUBMITTED, at=utcnow(), data={"n": 2})
    assert await store.insert_order(order, state, history=[first]) is InsertOutcome.CREATED
    assert await store.insert_order(order, state, history=[again]) is InsertOutcome.EXISTS
    other, other_state = order_pair("o-hist", customer_id="someone-else")
    refused = await store.insert_order(other, other_state, history=[again])
    assert refused is InsertOutcome.CONFLICT
    assert [e.data for e in await store.read_history("o-hist")] == [{"n": 1}]


async def test_concurrent_inserts_of_one_order_make_one_order(store: StateStore, hub: str) -> None:
    """Copies of one order recorded side by side, in one process and (PostgreSQL) in four,
    whose statements' snapshots do not see each other's insert: one is CREATED, the others
    EXISTS, never CONFLICT; one state record, one history event; a different order under the
    id is still a CONFLICT."""
    stores: list[StateStore] = [store]
    if store.kind == "postgresql":
        stores += [
            await PostgresStore.connect(
                POSTGRES_URL, hub, pool_size=2, timeout=5.0, command_timeout=10.0
            )
            for _ in range(3)
        ]
    try:
        for round_ in range(5):
            order_id = f"o-race-{round_}"
            order, state = order_pair(order_id)

            async def insert(
                s: StateStore, order: OrderRecord = order, state: StateRecord = state
            ) -> InsertOutcome:
                event = HistoryEvent(
                    order_id=order.order_id, type=H.ORDER_SUBMITTED, at=utcnow(), data={}
                )
                return await s.insert_order(order, state, history=[event])

            outcomes = await asyncio.gather(*(insert(s) for s in stores for _ in range(2)))
            assert outcomes.count(InsertOutcome.CREATED) == 1
            assert outcomes.count(InsertOutcome.EXISTS) == len(outcomes) - 1
            assert await store.get_state(order_id) == state
            assert len(await store.read_history(order_id)) == 1
            other, other_state = order_pair(order_id, customer_id="someone-else")
            outcomes = await asyncio.gather(*(s.insert_order(other, other_state) for s in stores))
            assert set(outcomes) == {InsertOutcome.CONFLICT}
    finally:
        for s in stores[1:]:
            await s.close()


async def test_side_by_side_writes_each_get_their_own_answer(store: StateStore) -> None:
    """Conditional updates made side by side (PostgreSQL sends those of one statement in one
    round trip): each gets its own record, or None when its condition does not hold, and one
    update whose value the store refuses fails alone."""
    ids = [f"o-side-{i:02}" for i in range(12)]
    for order_id in ids:
        await store.insert_order(*order_pair(order_id))
    records = {r.order_id: r for r in await _claim_all(store, ids)}
    now = utcnow()

    def one(order_id: str, *, stale: bool = False, owner: str = "sched-b"):
        record = records[order_id]
        expect = Expect(locked_by="not-the-lock" if stale else record.locked_by)
        changes = Changes(fields={"owner": owner, "updated_at": now})
        return store.update_state(order_id, expect, changes)

    results = await asyncio.gather(*(one(i, stale=n % 3 == 0) for n, i in enumerate(ids)))
    for n, (order_id, after) in enumerate(zip(ids, results, strict=True)):
        if n % 3 == 0:
            assert after is None
        else:
            assert after is not None and after.order_id == order_id and after.updated_at == now
    if store.kind != "postgresql":
        return  # only PostgreSQL refuses NUL in text (the other stores hold it)
    # The same statement as the others (the same fields), so the three go together.
    outcomes = await asyncio.gather(
        one(ids[1], owner="bad\x00owner"), one(ids[2]), one(ids[4]), return_exceptions=True
    )
    assert isinstance(outcomes[0], StoreRefused)
    assert all(isinstance(o, StateRecord) for o in outcomes[1:])


async def _claim_all(store: StateStore, ids: list[str]):
    now = utcnow()
    claimed = await store.claim(
        now=now, limit=len(ids), owner="sched-a", complete_by=now + timedelta(seconds=30)
    )
    assert sorted(r.order_id for r in claimed) == sorted(ids)
    return claimed


async def test_an_inserted_state_record_wakes_the_arrival_watchers(store: StateStore) -> None:
    if store.kind == "mongodb":
        # It cannot watch: its watch never wakes, and stays alive (the scheduler polls).
        watch = await store.watch_arrivals(lambda: None)
        assert watch.alive
        await watch.close()
        return
    woken = asyncio.Event()
    watch = await store.watch_arrivals(woken.set)
    try:
        assert watch.alive
        await store.insert_order(*order_pair("o-other-before"))
        await asyncio.wait_for(woken.wait(), timeout=5)
        woken.clear()
        order, state = order_pair("o-arrives")
        await store.insert_order(order, state)
        await asyncio.wait_for(woken.wait(), timeout=5)
        # The same order again inserts nothing new: no wake (given a moment to come).
        woken.clear()
        await store.insert_order(order, state)
        await store.get_state("o-arrives")  # a round trip after it, for a notification
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(woken.wait(), timeout=0.3)
    finally:
        await watch.close()
    assert not watch.alive
    woken.clear()
    await store.insert_order(*order_pair("o-after-close"))
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(woken.wait(), timeout=0.3)


async def test_records_round_trip_exactly(store: StateStore) -> None:
    order, state = order_pair("o-rt", reply_to="app.replies")
    await store.insert_order(order, state)
    assert await store.get_order("o-rt") == order
    assert await store.get_state("o-rt") == state
    assert await store.get_state("missing") is None
    assert await store.get_order("missing") is None


async def test_several_orders_read_at_once_come_back_in_the_order_asked(store: StateStore) -> None:
    pairs = [order_pair(f"o-many-{i}") for i in range(3)]
    for order, state in pairs:
        await store.insert_order(order, state)
    orders = [order for order, _ in pairs]
    ids = ["o-many-2", "missing", "o-many-0", "o-many-2", "o-many-1"]
    assert await store.get_orders(ids) == [orders[2], None, orders[0], orders[2], orders[1]]
    assert await store.get_orders([]) == []


async def test_update_applies_exactly_the_changes_when_the_condition_holds(
    store: StateStore,
) -> None:
    order, state = order_pair("o-up")
    await store.insert_order(order, state)
    claimed = await claim_one(store, "o-up")
    now = utcnow()
    update = start_step(
        claimed,
        "reserve",
        instance=claimed.locked_by,
        now=now,
        timeout=timedelta(seconds=5),
        allowance=3,
    )
    after = await store.update_state("o-up", update.expect, update.changes)
    assert after == apply(claimed, update.changes)
    assert after.steps["reserve"].status is StepStatus.RUNNING
    assert after.retry_budget.used == 3
    assert await store.get_state("o-up") == after


@pytest.mark.parametrize(
    "wrong",
    [
        Expect(locked_by="o-c:99"),
        Expect(locked_by=None),
        Expect(process_state=frozenset({ProcessState.PENDING})),
        Expect(complete_by=None),
        Expect(updated_at=utcnow() - timedelta(days=1)),
        Expect(due_by=utcnow() - timedelta(days=1)),
    ],
    ids=["locked_by", "locked_by-null", "process_state", "complete_by", "updated_at", "due_by"],
)
async def test_update_changes_nothing_when_the_condition_fails(
    store: StateStore, wrong: Expect
) -> None:
    order, state = order_pair("o-c")
    await store.insert_order(order, state)
    claimed = await claim_one(store, "o-c")
    changes = Changes(fields={"process_state": ProcessState.ERROR, "updated_at": utcnow()})
    assert await store.update_state("o-c", wrong, changes) is None
    assert await store.get_state("o-c") == claimed


async def test_write_fenced_by_a_superseded_attempt_changes_nothing(store: StateStore) -> None:
    order, state = order_pair("o-fence")
    await store.insert_order(order, state)
    first = await claim_one(store, "o-fence", timeout=0.001)
    assert first.locked_by is not None
    assert parse_instance_id(first.locked_by) == ("o-fence", 1)

    # The first attempt's deadline passes; the supervisor recovers; a second attempt claims.
    await asyncio.sleep(0.01)  # let a 1 ms deadline pass in wall-clock time (not a sync wait)
    rec = recover(first, now=utcnow(), policy=RecoveryPolicy(1_000, lambda n: timedelta(0)))
    assert await store.update_state("o-fence", rec.expect, rec.changes) is not None
    second = await claim_one(store, "o-fence")
    assert second.locked_by is not None
    assert parse_instance_id(second.locked_by) == ("o-fence", 2)

    # The first attempt wakes up and tries to record a result: nothing changes.
    late = complete_step(
        first,
        ORDER_WORKFLOW,
        "reserve",
        instance=first.locked_by,
        now=utcnow(),
        result={"reservation": "r1"},
        attempts_used=1,
    )
    assert await store.update_state("o-fence", late.expect, late.changes) is None
    assert await store.get_state("o-fence") == second


async def test_claim_takes_only_due_unlocked_pending_records(store: StateStore) -> None:
    now = utcnow()
    due, due_state = order_pair("o-due", now=now)
    later, later_state = order_pair("o-later", now=now, due_in=timedelta(hours=1))
    for o, s in ((due, due_state), (later, later_state)):
        await store.insert_order(o, s)

    deadline = now + timedelta(seconds=30)
    claimed = await store.claim(now=now, limit=10, owner="sched-a", complete_by=deadline)
    assert [r.order_id for r in claimed] == ["o-due"]
    record = claimed[0]
    assert record.process_state is ProcessState.PROCESSING
    assert (record.attempt, record.owner) == (1, "sched-a")
    assert record.locked_by is not None and parse_instance_id(record.locked_by) == ("o-due", 1)
    assert record.complete_by == deadline
    assert await store.claim(now=now, limit=10, owner="sched-b", complete_by=deadline) == []


async def test_a_claim_carries_each_attempts_execution_started_when_asked(
    store: StateStore,
) -> None:
    """One write a claimed record, its ExecutionStarted with it (no append after the claim)."""
    for i in range(3):
        await store.insert_order(*order_pair(f"o-st-{i}"))
    now = utcnow()
    deadline = now + timedelta(seconds=30)
    claimed = await store.claim(
        now=now, limit=2, owner="sched-a", complete_by=deadline, started_by="scheduler-a"
    )
    assert len(claimed) == 2
    for record in claimed:
        started = [
            e for e in await store.read_history(record.order_id) if e.type is H.EXECUTION_STARTED
        ]
        assert [(e.attempt, e.instance_id, e.at, e.data) for e in started] == [
            (1, record.locked_by, now, {"by": "scheduler-a"})
        ]
    # Not asked: no event.
    [rest] = await store.claim(now=now, limit=5, owner="sched-b", complete_by=deadline)
    history = await store.read_history(rest.order_id)
    assert H.EXECUTION_STARTED not in [e.type for e in history]


async def test_claim_respects_its_limit(store: StateStore) -> None:
    for i in range(7):
        await store.insert_order(*order_pair(f"o-lim-{i}"))
    now = utcnow()
    first = await store.claim(now=now, limit=5, owner="a", complete_by=now + timedelta(seconds=9))
    rest = await store.claim(now=now, limit=5, owner="b", complete_by=now + timedelta(seconds=9))
    assert len(first) == 5
    assert len(rest) == 2
    assert {r.order_id for r in first}.isdisjoint({r.order_id for r in rest})


async def test_twenty_concurrent_claimers_claim_each_of_200_records_exactly_once(
    store: StateStore,
) -> None:
    now = utcnow()
    for i in range(200):
        await store.insert_order(*order_pair(f"o-cc-{i:03d}", now=now))

    async def claimer(name: str) -> list[str]:
        got: list[str] = []
        idle_rounds = 0
        while idle_rounds < 3:
            t = utcnow()
            batch = await store.claim(
                now=t, limit=8, owner=name, complete_by=t + timedelta(seconds=60)
            )
            got += [r.order_id for r in batch]
            idle_rounds = 0 if batch else idle_rounds + 1
        return got

    results = await asyncio.gather(*(claimer(f"sched-{i}") for i in range(20)))
    claimed = [order_id for batch in results for order_id in batch]
    assert len(claimed) == 200
    assert len(set(claimed)) == 200
    counts = await store.count_by_state()
    assert counts[ProcessState.PROCESSING] == 200
    assert counts[ProcessState.PENDING] == 0


async def test_two_supervisors_racing_on_one_expired_record_recover_it_once(
    store: StateStore,
) -> None:
    order, state = order_pair("o-race")
    await store.insert_order(order, state)
    claimed = await claim_one(store, "o-race", timeout=0.001)
    await asyncio.sleep(0.01)  # let a 1 ms deadline pass in wall-clock time
    seen = await store.get_state("o-race")
    now = utcnow()
    updates = [recover(seen, now=now, policy=POLICY) for _ in range(2)]
    results = await asyncio.gather(
        *(store.update_state("o-race", u.expect, u.changes) for u in updates)
    )
    winners = [r for r in results if r is not None]
    assert len(winners) == 1
    after = await store.get_state("o-race")
    assert after.process_state is ProcessState.PENDING
    assert after.failure_count == 1
    assert after.locked_by is None
    assert claimed.attempt == after.attempt == 1


async def test_a_step_completed_after_the_scan_is_not_reset_by_the_recovery(
    store: StateStore,
) -> None:
    """The reply beat the deadline but its write landed just after it, after the supervisor's
    scan had read the record: the recovery must match nothing, and the step stays Completed."""
    order, state = order_pair("o-late-write")
    await store.insert_order(order, state)
    claimed = await claim_one(store, "o-late-write")
    instance = claimed.locked_by
    start = start_step(
        claimed,
        "reserve",
        instance=instance,
        now=utcnow() - timedelta(seconds=5),
        timeout=timedelta(seconds=1),
        allowance=2,
    )
    running = await store.update_state("o-late-write", start.expect, start.changes)
    seen = await store.get_state("o-late-write")  # the supervisor's scan: expired
    assert seen == running and seen.complete_by < utcnow()
    done = complete_step(
        running,
        ORDER_WORKFLOW,
        "reserve",
        instance=instance,
        now=utcnow(),
        result={},
        attempts_used=1,
    )
    assert await store.update_state("o-late-write", done.expect, done.changes) is not None
    rec = recover(seen, now=utcnow(), policy=POLICY)
    assert await store.update_state("o-late-write", rec.expect, rec.changes) is None
    after = await store.get_state("o-late-write")
    assert after.steps["reserve"].status is StepStatus.COMPLETED
    assert after.locked_by == instance


async def test_recovery_at_the_threshold_parks_the_order_in_error(store: StateStore) -> None:
    order, state = order_pair("o-park")
    await store.insert_order(order, state)
    policy = RecoveryPolicy(failure_threshold=1, backoff=lambda n: timedelta(0))
    await claim_one(store, "o-park", timeout=0.001)
    await asyncio.sleep(0.01)  # let a 1 ms deadline pass in wall-clock time
    seen = await store.get_state("o-park")
    update = recover(seen, now=utcnow(), policy=policy)
    after = await store.update_state("o-park", update.expect, update.changes)
    assert after.process_state is ProcessState.ERROR
    assert after.error.kind is ErrorKind.RECOVERY_LIMIT


async def test_scan_pages_through_expired_records_in_deadline_order(store: StateStore) -> None:
    base = utcnow() - timedelta(minutes=10)
    for i in range(25):
        order, state = order_pair(f"o-scan-{i:02d}")
        await store.insert_order(order, state)
        await store.update_state(
            order.order_id,
            Expect(),
            Changes(
                fields={
                    "process_state": ProcessState.PROCESSING,
                    "locked_by": f"{order.order_id}:1",
                    "complete_by": base + timedelta(seconds=i % 5),
                    "updated_at": base,
                }
            ),
        )
    live, live_state = order_pair("o-scan-live")
    await store.insert_order(live, live_state)
    await store.update_state(
        "o-scan-live",
        Expect(),
        Changes(
            fields={
                "process_state": ProcessState.PROCESSING,
                "complete_by": utcnow() + timedelta(hours=1),
            }
        ),
    )

    now = utcnow()
    states = frozenset({ProcessState.PROCESSING})
    seen: list[str] = []
    cursor = None
    pages = 0
    while True:
        page = await store.scan_expired(now=now, states=states, limit=10, after=cursor)
        seen += [r.order_id for r in page.records]
        pages += 1
        cursor = page.next_cursor
        if cursor is None:
            break
    assert pages == 3
    assert len(seen) == 25
    assert len(set(seen)) == 25
    assert "o-scan-live" not in seen
    keys = [(base + timedelta(seconds=int(s[-2:]) % 5), s) for s in seen]
    assert keys == sorted(keys)

    recent = await store.scan_expired(
        now=now, states=states, limit=100, not_before=base + timedelta(seconds=4)
    )
    assert sorted(r.order_id for r in recent.records) == [
        f"o-scan-{i:02d}" for i in range(4, 25, 5)
    ]
    nothing = await store.scan_expired(
        now=now, states=frozenset({ProcessState.COMPENSATING}), limit=10
    )
    assert nothing.records == [] and nothing.next_cursor is None


async def test_count_by_state_counts_every_state(store: StateStore) -> None:
    for i in range(3):
        await store.insert_order(*order_pair(f"o-n-{i}"))
    await store.update_state(
        "o-n-0",
        Expect(process_state=frozenset({ProcessState.PENDING})),
        Changes(
            fields={
                "process_state": ProcessState.ERROR,
                "error": ErrorInfo(kind=ErrorKind.PERMANENT, message="x", at=utcnow()),
            }
        ),
    )
    counts = await store.count_by_state()
    assert counts[ProcessState.PENDING] == 2
    assert counts[ProcessState.ERROR] == 1
    assert set(counts) == set(ProcessState)


async def test_init_is_idempotent(store: StateStore) -> None:
    await store.insert_order(*order_pair("o-init"))
    await store.init()
    await store.init()
    assert (await store.get_state("o-init")).process_state is ProcessState.PENDING


def test_any_is_the_default_expectation() -> None:
    assert Expect().locked_by is ANY


async def test_listing_and_counting_for_admission_audit_and_stuck_reports(
    store: StateStore,
) -> None:
    now = utcnow()
    for i in range(5):
        await store.insert_order(*order_pair(f"o-l-{i}", now=now - timedelta(minutes=i)))
    await store.claim(now=now, limit=2, owner="a", complete_by=now + timedelta(seconds=30))
    pending_processing = frozenset({ProcessState.PENDING, ProcessState.PROCESSING})
    assert await store.count_in_states(pending_processing) == 5
    assert await store.count_in_states(frozenset({ProcessState.PROCESSING})) == 2

    stuck = await store.find_stuck_pending(due_before=now - timedelta(seconds=90), limit=10)
    assert all(r.process_state is ProcessState.PENDING for r in stuck)
    assert [r.order_id for r in stuck] == sorted(
        (r.order_id for r in stuck), key=lambda o: -int(o[-1])
    )
    assert {r.order_id for r in stuck} <= {"o-l-2", "o-l-3", "o-l-4"}

    first = await store.list_states(after=None, limit=3)
    rest = await store.list_states(after=first[-1].order_id, limit=3)
    assert [r.order_id for r in first + rest] == [f"o-l-{i}" for i in range(5)]
    ids = await store.list_order_ids(after="o-l-1", limit=10)
    assert ids == ["o-l-2", "o-l-3", "o-l-4"]


async def test_claiming_compensations_takes_only_unlocked_compensating_records(
    store: StateStore,
) -> None:
    now = utcnow()
    for i in range(3):
        await store.insert_order(*order_pair(f"o-comp-{i}", now=now))
    for order_id, locked in (("o-comp-0", None), ("o-comp-1", "o-comp-1:1")):
        await store.update_state(
            order_id,
            Expect(),
            Changes(
                fields={
                    "process_state": ProcessState.COMPENSATING,
                    "locked_by": locked,
                    "attempt": 1,
                }
            ),
        )
    later = now + timedelta(seconds=30)
    claimed = await store.claim(now=now, limit=10, owner="s", complete_by=later, compensating=True)
    assert [(r.order_id, r.process_state, r.attempt) for r in claimed] == [
        ("o-comp-0", ProcessState.COMPENSATING, 2)
    ]
    assert claimed[0].locked_by is not None
    assert parse_instance_id(claimed[0].locked_by) == ("o-comp-0", 2)
    assert claimed[0].complete_by == later
    forward = await store.claim(now=now, limit=10, owner="s", complete_by=later)
    assert [r.order_id for r in forward] == ["o-comp-2"]


async def test_query_filters_by_state_age_and_error_kind_newest_change_first_in_pages(
    store: StateStore,
) -> None:
    t0 = utcnow() - timedelta(hours=1)
    declined = ErrorInfo(kind=ErrorKind.PERMANENT, message="declined", at=t0)
    timed_out = ErrorInfo(kind=ErrorKind.RECOVERY_LIMIT, message="recovered 5 times", at=t0)
    for i in range(12):
        order, state = order_pair(f"o-q{i:02d}", now=t0)
        changed = t0 + timedelta(minutes=i)
        if i % 3 == 0:
            fields = {"process_state": ProcessState.ERROR, "error": declined}
        elif i % 3 == 1:
            fields = {"process_state": ProcessState.ERROR, "error": timed_out}
        else:
            fields = {"process_state": ProcessState.PROCESSED}
        await store.insert_order(order, state.model_copy(update={**fields, "updated_at": changed}))
    errors = StateQuery(states=frozenset({ProcessState.ERROR}))
    listed = await store.query_states(errors, limit=100)
    assert [s.order_id for s in listed] == [
        f"o-q{i:02d}" for i in reversed(range(12)) if i % 3 != 2
    ]
    permanent = StateQuery(states=errors.states, error_kind=ErrorKind.PERMANENT)
    assert [s.order_id for s in await store.query_states(permanent, limit=100)] == [
        "o-q09",
        "o-q06",
        "o-q03",
        "o-q00",
    ]
    old = StateQuery(changed_before=t0 + timedelta(minutes=3))
    assert [s.order_id for s in await store.query_states(old, limit=100)] == [
        "o-q02",
        "o-q01",
        "o-q00",
    ]
    # Pages continue after the last record of the previous page, however ties fall.
    seen: list[str] = []
    cursor = None
    while page := await store.query_states(StateQuery(), limit=5, after=cursor):
        seen += [s.order_id for s in page]
        cursor = ListCursor(page[-1].updated_at, page[-1].order_id)
    assert seen == [f"o-q{i:02d}" for i in reversed(range(12))]


CLAIM_CASES = {
    # order id: (process_state, locked_by, attempt, due in)
    "o-k-due": (ProcessState.PENDING, None, 0, timedelta(seconds=-1)),
    "o-k-due-now": (ProcessState.PENDING, None, 0, timedelta(0)),
    "o-k-later": (ProcessState.PENDING, None, 0, timedelta(hours=1)),
    "o-k-locked": (ProcessState.PENDING, "o-k-locked:1", 1, timedelta(seconds=-1)),
    "o-k-again": (ProcessState.PENDING, None, 2, timedelta(seconds=-1)),
    "o-k-running": (ProcessState.PROCESSING, "o-k-running:1", 1, timedelta(seconds=-1)),
    "o-k-undo": (ProcessState.COMPENSATING, None, 1, timedelta(seconds=-1)),
    "o-k-undo-held": (ProcessState.COMPENSATING, "o-k-undo-held:2", 2, timedelta(seconds=-1)),
    "o-k-undo-later": (ProcessState.COMPENSATING, None, 1, timedelta(hours=1)),
    "o-k-error": (ProcessState.ERROR, None, 1, timedelta(seconds=-1)),
    "o-k-done": (ProcessState.PROCESSED, None, 1, timedelta(seconds=-1)),
}


@pytest.mark.parametrize("compensating", [False, True], ids=["claim", "claim-compensation"])
async def test_a_claim_changes_each_record_exactly_as_the_pure_claim_says(
    store: StateStore, compensating: bool
) -> None:
    """The claim of the transition table as a value (`shared/domain/claims.py`): the store takes
    exactly the records its condition matches and leaves each as `apply` of its changes would."""
    now = utcnow()
    for order_id, (state, locked_by, attempt, due_in) in CLAIM_CASES.items():
        await store.insert_order(*order_pair(order_id, now=now, due_in=due_in))
        fields = {"process_state": state, "locked_by": locked_by, "attempt": attempt}
        assert await store.update_state(order_id, Expect(), Changes(fields=fields)) is not None
    before = {order_id: await store.get_state(order_id) for order_id in CLAIM_CASES}
    terms = {"now": now, "limit": 50, "owner": "s", "complete_by": now + timedelta(seconds=30)}
    claimed = await store.claim(**terms, compensating=compensating)
    # One claim, one nonce: every token it issued carries it (shared/domain/identity.py).
    [nonce] = {nonce_of(r.locked_by or "") for r in claimed}
    assert nonce is not None
    spec = replace(claim_for(**terms, compensating=compensating), nonce=nonce)

    expected = {
        order_id: apply(record, spec.changes(order_id, record.attempt))
        if matches(record, spec.expect)
        else record
        for order_id, record in before.items()
        if record is not None
    }
    taken = sorted(o for o, r in before.items() if r is not None and matches(r, spec.expect))
    assert taken == (["o-k-undo"] if compensating else ["o-k-again", "o-k-due", "o-k-due-now"])
    assert sorted(r.order_id for r in claimed) == taken
    assert all(r == expected[r.order_id] for r in claimed)
    assert {order_id: await store.get_state(order_id) for order_id in CLAIM_CASES} == expected
