"""Contract: retention purges (issue 14), for every store adapter.

Each purge deletes what expired and nothing else, in batches of at most its limit: the inbox's
lapsed entries (never a live claim), the journal and the whole of finished orders past their
retention (never a parked or live order), old alerts.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shared.domain.coordination import InboxOutcome
from shared.domain.journal import (
    Alert,
    AlertKind,
    CompensationEntry,
    HistoryEvent,
    HistoryEventType,
    Severity,
)
from shared.domain.states import TERMINAL_STATES, ProcessState
from shared.domain.timing import utcnow
from shared.domain.updates import Changes, Expect
from shared.store.port import StateStore
from tests.support.factories import order_pair
from tests.support.stores import StoreUnderTest

H = HistoryEventType
PARKED_OR_LIVE = frozenset(ProcessState) - TERMINAL_STATES


async def _order(
    store: StoreUnderTest, order_id: str, state: ProcessState, finished: datetime, events: int = 2
) -> None:
    """An order in `state` since `finished`, with `events` history events and one undo logged,
    all before that time."""
    await store.insert_order(*order_pair(order_id, now=finished - timedelta(seconds=events)))
    for i in range(events):
        at = finished - timedelta(seconds=events - i)
        await store.append_history(HistoryEvent(order_id=order_id, type=H.ORDER_SUBMITTED, at=at))
    entry = CompensationEntry(
        order_id=order_id,
        step="reserve",
        undo="inventory.release",
        idempotency_key=f"{order_id}:reserve:undo",
        recorded_at=finished - timedelta(seconds=events),
    )
    await store.append_compensation(entry)
    changes = Changes(fields={"process_state": state, "updated_at": finished})
    assert await store.update_state(order_id, Expect(), changes) is not None


async def _present(store: StateStore, order_id: str) -> tuple[bool, bool, int, int]:
    """Whether the order record and the state record exist; history and undos kept."""
    return (
        await store.get_order(order_id) is not None,
        await store.get_state(order_id) is not None,
        len(await store.read_history(order_id)),
        len(await store.read_compensation(order_id)),
    )


# -- the inbox ----------------------------------------------------------------------------------


async def test_inbox_purge_deletes_expired_entries_and_keeps_live_claims(
    store: StoreUnderTest,
) -> None:
    now = utcnow()
    past, future = now - timedelta(seconds=1), now + timedelta(hours=1)
    # Handled past the dedupe window, and a claim whose holder let it lapse: expired.
    await store.inbox_claim("q", "done-old", holder="a", now=now, claim_until=future)
    assert await store.inbox_complete("q", "done-old", holder="a", keep_until=past)
    await store.inbox_claim("q", "lapsed", holder="dead", now=now, claim_until=past)
    # Handled within the window, and a claim in flight: kept.
    await store.inbox_claim("q", "done-new", holder="a", now=now, claim_until=future)
    assert await store.inbox_complete("q", "done-new", holder="a", keep_until=future)
    await store.inbox_claim("q", "in-flight", holder="b", now=now, claim_until=future)

    assert await store.inbox_purge(now=now, limit=100) == 2
    assert await store.inbox_purge(now=now, limit=100) == 0
    claim = {"now": now, "claim_until": future}
    assert await store.inbox_claim("q", "done-new", holder="c", **claim) is InboxOutcome.DUPLICATE
    assert await store.inbox_claim("q", "in-flight", holder="c", **claim) is InboxOutcome.BUSY
    # What was purged is forgotten: its id is new again.
    assert await store.inbox_claim("q", "done-old", holder="c", **claim) is InboxOutcome.CLAIMED
    assert await store.inbox_claim("q", "lapsed", holder="c", **claim) is InboxOutcome.CLAIMED


async def test_inbox_purge_deletes_at_most_its_limit_oldest_first(store: StoreUnderTest) -> None:
    now = utcnow()
    for i in range(5):
        expired = now - timedelta(seconds=10 - i)
        await store.inbox_claim("q", f"m{i}", holder="a", now=now, claim_until=expired)
    assert [await store.inbox_purge(now=now, limit=2) for _ in range(4)] == [2, 2, 1, 0]


# -- the journal --------------------------------------------------------------------------------


async def test_journal_purge_deletes_only_the_journal_of_orders_finished_before_the_cutoff(
    store: StateStore,
) -> None:
    now = utcnow()
    old = now - timedelta(days=40)
    cases = {
        "o-old-done": (ProcessState.PROCESSED, old),
        "o-old-undone": (ProcessState.COMPENSATED, old),
        "o-old-error": (ProcessState.ERROR, old),  # parked: an operator still needs it
        "o-old-undo-failed": (ProcessState.COMPENSATION_FAILED, old),
        "o-new-done": (ProcessState.PROCESSED, now),
        "o-running": (ProcessState.PROCESSING, old),
    }
    for order_id, (state, at) in cases.items():
        await _order(store, order_id, state, at, events=3)

    cutoff = now - timedelta(days=30)
    # Bounded: 6 history events and 2 undos are due; at most 4 of each a batch.
    first = await store.purge_journal(finished_before=cutoff, limit=4)
    assert (first.history, first.compensation) == (4, 2)
    rest = await store.purge_journal(finished_before=cutoff, limit=4)
    assert (rest.history, rest.compensation) == (2, 0)
    again = await store.purge_journal(finished_before=cutoff, limit=4)
    assert (again.history, again.compensation) == (0, 0)

    for order_id in cases:
        kept = order_id not in ("o-old-done", "o-old-undone")
        order, state, history, undos = await _present(store, order_id)
        assert (history, undos) == ((3, 1) if kept else (0, 0)), order_id
        # The order and its state record stay: only the journal expired.
        assert order and state, order_id


# -- finished orders ----------------------------------------------------------------------------


async def test_order_purge_deletes_finished_orders_whole_and_never_parked_or_live_ones(
    store: StateStore,
) -> None:
    now = utcnow()
    old = now - timedelta(days=100)
    gone = {"o-done": ProcessState.PROCESSED, "o-undone": ProcessState.COMPENSATED}
    kept = {f"o-{s.value.lower()}": s for s in PARKED_OR_LIVE}
    for order_id, state in (gone | kept).items():
        await _order(store, order_id, state, old)
    await _order(store, "o-done-recently", ProcessState.PROCESSED, now)

    cutoff = now - timedelta(days=90)
    first = await store.purge_orders(finished_before=cutoff, limit=1)
    assert (first.orders, first.history, first.compensation) == (1, 2, 1)
    rest = await store.purge_orders(finished_before=cutoff, limit=10)
    assert (rest.orders, rest.history, rest.compensation) == (1, 2, 1)
    assert (await store.purge_orders(finished_before=cutoff, limit=10)).orders == 0

    for order_id in gone:
        assert await _present(store, order_id) == (False, False, 0, 0), order_id
    for order_id in [*kept, "o-done-recently"]:
        assert await _present(store, order_id) == (True, True, 2, 1), order_id


async def test_an_order_id_is_new_again_once_its_order_was_purged(store: StateStore) -> None:
    old = utcnow() - timedelta(days=100)
    await _order(store, "o-again", ProcessState.PROCESSED, old)
    purged = await store.purge_orders(finished_before=utcnow() - timedelta(days=90), limit=10)
    assert purged.orders == 1
    outcome = await store.insert_order(*order_pair("o-again"))
    assert outcome.value == "created"


CUTOFF_AGE_S = 1000
AGES_S = st.sampled_from([0, 1, CUTOFF_AGE_S - 1, CUTOFF_AGE_S, CUTOFF_AGE_S + 1, 86_400])


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    orders=st.lists(st.tuples(st.sampled_from(list(ProcessState)), AGES_S), max_size=12),
    limit=st.integers(min_value=1, max_value=5),
)
async def test_retention_never_deletes_a_parked_or_live_order_whatever_the_states_and_times(
    store: StateStore, orders: list[tuple[ProcessState, int]], limit: int
) -> None:
    now = utcnow()
    cutoff = now - timedelta(seconds=CUTOFF_AGE_S)
    run = uuid.uuid4().hex[:8]
    ids = {f"p{run}-{i}": (state, age) for i, (state, age) in enumerate(orders)}
    for order_id, (state, age) in ids.items():
        await _order(store, order_id, state, now - timedelta(seconds=age))

    # The journal first, then the orders, as the supervisor does; each batch within its limit.
    while (journal := await store.purge_journal(finished_before=cutoff, limit=limit)).history:
        assert journal.history <= limit and journal.compensation <= limit
    for _ in range(1000):
        batch = await store.purge_orders(finished_before=cutoff, limit=limit)
        assert batch.orders <= limit
        if not batch.orders:
            break
    else:
        raise AssertionError("the purge never ran dry")

    for order_id, (state, age) in ids.items():
        expired = state in TERMINAL_STATES and age > CUTOFF_AGE_S
        expected = (False, False, 0, 0) if expired else (True, True, 2, 1)
        assert await _present(store, order_id) == expected, (order_id, state, age)


# -- alerts and sizes ---------------------------------------------------------------------------


async def test_alert_purge_deletes_old_alerts_only_at_most_its_limit(store: StateStore) -> None:
    now = utcnow()
    for i, age in enumerate([100, 99, 98, 1]):
        alert = Alert(
            alert_id=f"a{i}",
            kind=AlertKind.ORDER_ERROR,
            severity=Severity.CRITICAL,
            message="m",
            at=now - timedelta(days=age),
            source="test",
        )
        assert await store.raise_alert(alert)
    cutoff = now - timedelta(days=90)
    assert await store.purge_alerts(raised_before=cutoff, limit=2) == 2
    assert await store.purge_alerts(raised_before=cutoff, limit=2) == 1
    assert await store.purge_alerts(raised_before=cutoff, limit=2) == 0
    assert [a.alert_id for a in await store.list_alerts()] == ["a3"]


async def test_record_counts_name_every_table_with_its_size(store: StoreUnderTest) -> None:
    now = utcnow()
    await _order(store, "o-count", ProcessState.PROCESSED, now, events=3)
    await store.inbox_claim("q", "m", holder="a", now=now, claim_until=now + timedelta(hours=1))
    counts = await store.record_counts()
    assert {"orders", "state", "inbox", "alerts"} <= set(counts)
    assert (counts["orders"], counts["state"], counts["inbox"], counts["alerts"]) == (1, 1, 1, 0)
    if store.kind != "mongodb":  # where the journal has tables of its own (MongoDB: in `state`)
        assert (counts["history"], counts["compensation_log"]) == (3, 1)
