"""Contract: history, compensation log, inbox, lease and alerts, for every store adapter."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from datetime import datetime, timedelta

import pytest

from shared.domain.coordination import ComponentStatus, InboxOutcome
from shared.domain.journal import (
    Alert,
    AlertAction,
    AlertKind,
    CompensationEntry,
    HistoryEvent,
    HistoryEventType,
    Severity,
    UndoStatus,
)
from shared.domain.states import ProcessState
from shared.domain.timing import utcnow
from shared.domain.updates import Changes, Expect
from shared.store.port import AlertCursor, InboxClaim, InboxDone, StateStore, UndoMark
from shared.store.postgres import PostgresStore
from tests.conftest import POSTGRES_URL
from tests.support.factories import order_pair, undo_entry
from tests.support.stores import StoreUnderTest

H = HistoryEventType


async def _recorded(store: StateStore, *order_ids: str) -> None:
    """Orders with their state records: an order's journal is kept with its state record (on
    MongoDB, in it), so every case records the order before it appends."""
    for order_id in order_ids:
        await store.insert_order(*order_pair(order_id))


async def test_history_reads_back_in_append_order(store: StateStore) -> None:
    await _recorded(store, "o-h", "o-other")
    t = utcnow()
    events = [
        HistoryEvent(order_id="o-h", type=H.ORDER_SUBMITTED, at=t),
        HistoryEvent(
            order_id="o-h", type=H.EXECUTION_STARTED, at=t, attempt=1, instance_id="o-h:1"
        ),
        HistoryEvent(
            order_id="o-h",
            type=H.STEP_SCHEDULED,
            at=t + timedelta(milliseconds=1),
            attempt=1,
            instance_id="o-h:1",
            step="reserve",
            data={"complete_by": "x"},
        ),
    ]
    for e in events:
        await store.append_history(e)
    await store.append_history(HistoryEvent(order_id="o-other", type=H.ORDER_SUBMITTED, at=t))

    read = await store.read_history("o-h")
    assert [e.model_copy(update={"seq": None}) for e in read] == events
    seqs = [e.seq for e in read]
    assert seqs == sorted(seqs) and len(set(seqs)) == 3
    assert await store.read_history("nobody") == []


async def test_compensation_log_is_ordered_idempotent_and_done_is_final(
    store: StoreUnderTest,
) -> None:
    await _recorded(store, "o-comp")
    t = utcnow()
    for step, undo in (("reserve", "inventory.release"), ("charge", "payment.refund")):
        entry = CompensationEntry(
            order_id="o-comp",
            step=step,
            undo=undo,
            idempotency_key=f"o-comp:{step}:undo",
            recorded_at=t,
        )
        assert await store.append_compensation(entry) is True
        assert await store.append_compensation(entry) is False
    log = await store.read_compensation("o-comp")
    assert [e.step for e in log] == ["reserve", "charge"]
    assert all(e.status is UndoStatus.PENDING for e in log)


async def test_an_undo_outcome_is_fenced_like_the_record_and_done_is_final(
    store: StoreUnderTest,
) -> None:
    order, state = order_pair("o-undo")
    await store.insert_order(order, state)
    t = utcnow()
    entry = undo_entry("o-undo", "charge", at=t)
    await store.append_compensation(entry)
    live = Changes(fields={"locked_by": "o-undo:2", "updated_at": t})
    assert await store.update_state("o-undo", Expect(), live) is not None

    async def mark(fence: str, status: UndoStatus, error: str | None = None) -> bool:
        changes = Changes(fields={"updated_at": utcnow()})
        undo = UndoMark("charge", status, t, error)
        after = await store.update_state("o-undo", Expect(locked_by=fence), changes, undo=undo)
        return after is not None

    async def logged() -> CompensationEntry:
        [only] = await store.read_compensation("o-undo")
        return only

    # A superseded compensator (an older instance id) marks nothing.
    assert not await mark("o-undo:1", UndoStatus.DONE)
    assert (await logged()).status is UndoStatus.PENDING
    assert await mark("o-undo:2", UndoStatus.FAILED, "503")
    assert ((await logged()).status, (await logged()).error) == (UndoStatus.FAILED, "503")
    assert await mark("o-undo:2", UndoStatus.DONE)
    assert await mark("o-undo:2", UndoStatus.FAILED, "late")  # the record moves on ...
    done = await logged()  # ... but Done is final
    assert (done.status, done.done_at, done.error) == (UndoStatus.DONE, t, None)


async def test_inbox_handles_a_message_id_once(store: StoreUnderTest) -> None:
    now = utcnow()
    claim = {"now": now, "claim_until": now + timedelta(seconds=30)}
    assert await store.inbox_claim("q", "m1", holder="a", **claim) is InboxOutcome.CLAIMED
    assert await store.inbox_claim("q", "m1", holder="b", **claim) is InboxOutcome.BUSY
    assert await store.inbox_claim("other-q", "m1", holder="b", **claim) is InboxOutcome.CLAIMED
    assert await store.inbox_complete("q", "m1", holder="a", keep_until=now + timedelta(hours=1))
    assert await store.inbox_claim("q", "m1", holder="b", **claim) is InboxOutcome.DUPLICATE


async def test_inbox_claims_and_completes_a_batch_with_one_outcome_each(
    store: StoreUnderTest,
) -> None:
    now = utcnow()
    until = now + timedelta(seconds=30)
    keep = now + timedelta(hours=1)
    await store.inbox_claim("q", "done", holder="x", now=now, claim_until=until)
    await store.inbox_complete("q", "done", holder="x", keep_until=keep)
    await store.inbox_claim("q", "held", holder="x", now=now, claim_until=until)
    await store.inbox_claim("q", "mine", holder="a", now=now, claim_until=until)
    claims = [
        InboxClaim("new", "a", until),
        InboxClaim("done", "a", until),
        InboxClaim("held", "a", until),
        InboxClaim("mine", "a", until),  # re-entrant: the same holder claims again
        InboxClaim("new", "b", until),  # a second copy in the same batch finds it taken
        InboxClaim("other", "b", until),
    ]
    assert await store.inbox_claim_many("q", claims, now=now) == [
        InboxOutcome.CLAIMED,
        InboxOutcome.DUPLICATE,
        InboxOutcome.BUSY,
        InboxOutcome.CLAIMED,
        InboxOutcome.BUSY,
        InboxOutcome.CLAIMED,
    ]
    # "held" is x's: b's completion of it changes nothing.
    done = [
        InboxDone("new", "a", keep),
        InboxDone("other", "b", keep),
        InboxDone("held", "b", keep),
    ]
    await store.inbox_complete_many("q", done)
    again = [InboxClaim(m, "c", until) for m in ("new", "other", "held")]
    assert await store.inbox_claim_many("q", again, now=now) == [
        InboxOutcome.DUPLICATE,
        InboxOutcome.DUPLICATE,
        InboxOutcome.BUSY,
    ]


async def test_concurrent_batches_of_the_same_ids_in_any_order_claim_each_once(
    store: StateStore,
) -> None:
    """Copies of the same messages in two consumers' batches, in crossing order (a duplicate
    delivery): without one lock order the inserts deadlock."""
    now = utcnow()
    until = now + timedelta(seconds=30)
    for attempt in range(5):
        ids = [f"x{attempt}-{i:02}" for i in range(40)]
        batches = [
            [InboxClaim(m, f"holder-{j}", until) for m in (ids if j % 2 else ids[::-1])]
            for j in range(6)
        ]
        claimed = await asyncio.gather(*(store.inbox_claim_many("q", b, now=now) for b in batches))
        for m in ids:
            winners = [
                j
                for j, (b, r) in enumerate(zip(batches, claimed, strict=True))
                if r[[c.message_id for c in b].index(m)] is InboxOutcome.CLAIMED
            ]
            assert len(winners) == 1, (m, winners)


async def test_inbox_release_lets_a_redelivery_be_handled(store: StoreUnderTest) -> None:
    now = utcnow()
    claim = {"now": now, "claim_until": now + timedelta(seconds=30)}
    assert await store.inbox_claim("q", "m2", holder="a", **claim) is InboxOutcome.CLAIMED
    assert not await store.inbox_release("q", "m2", holder="b")
    assert await store.inbox_release("q", "m2", holder="a")
    assert await store.inbox_claim("q", "m2", holder="b", **claim) is InboxOutcome.CLAIMED


async def test_inbox_claim_of_a_dead_holder_and_a_passed_window_expire(
    store: StoreUnderTest,
) -> None:
    now = utcnow()
    short = {"now": now, "claim_until": now + timedelta(seconds=1)}
    assert await store.inbox_claim("q", "m3", holder="dead", **short) is InboxOutcome.CLAIMED
    later = now + timedelta(seconds=2)
    takeover = {"now": later, "claim_until": later + timedelta(seconds=30)}
    assert await store.inbox_claim("q", "m3", holder="b", **takeover) is InboxOutcome.CLAIMED
    assert not await store.inbox_complete("q", "m3", holder="dead", keep_until=later)
    assert await store.inbox_complete(
        "q", "m3", holder="b", keep_until=later + timedelta(seconds=5)
    )
    much_later = later + timedelta(seconds=6)
    again = {"now": much_later, "claim_until": much_later + timedelta(seconds=30)}
    assert await store.inbox_claim("q", "m3", holder="c", **again) is InboxOutcome.CLAIMED


async def test_concurrent_claims_of_one_message_id_let_exactly_one_through(
    store: StoreUnderTest,
) -> None:
    now = utcnow()
    outcomes = await asyncio.gather(
        *(
            store.inbox_claim(
                "q", "m-race", holder=f"h{i}", now=now, claim_until=now + timedelta(seconds=30)
            )
            for i in range(10)
        )
    )
    assert outcomes.count(InboxOutcome.CLAIMED) == 1
    assert outcomes.count(InboxOutcome.BUSY) == 9


async def test_lease_has_one_holder_until_it_expires(store: StateStore) -> None:
    now = utcnow()
    ttl = timedelta(seconds=10)
    assert await store.lease_acquire("leader", holder="a", now=now, expires_at=now + ttl)
    assert not await store.lease_acquire("leader", holder="b", now=now, expires_at=now + ttl)
    assert await store.lease_renew("leader", holder="a", now=now, expires_at=now + 2 * ttl)
    assert not await store.lease_renew("leader", holder="b", now=now, expires_at=now + 2 * ttl)
    lease = await store.lease_get("leader")
    assert (lease.holder, lease.expires_at, lease.acquired_at) == ("a", now + 2 * ttl, now)

    after_expiry = now + 3 * ttl
    assert not await store.lease_renew(
        "leader", holder="a", now=after_expiry, expires_at=after_expiry + ttl
    )
    assert await store.lease_acquire(
        "leader", holder="b", now=after_expiry, expires_at=after_expiry + ttl
    )
    assert (await store.lease_get("leader")).holder == "b"
    assert not await store.lease_release("leader", holder="a")
    assert await store.lease_release("leader", holder="b")
    assert await store.lease_get("leader") is None


async def test_concurrent_lease_acquires_elect_exactly_one_leader(store: StateStore) -> None:
    now = utcnow()
    results = await asyncio.gather(
        *(
            store.lease_acquire(
                "leader", holder=f"s{i}", now=now, expires_at=now + timedelta(seconds=10)
            )
            for i in range(8)
        )
    )
    assert results.count(True) == 1


async def test_alerts_are_stored_once_and_listed_newest_first(store: StateStore) -> None:
    t = utcnow()
    old = Alert(
        alert_id="a1",
        kind=AlertKind.ORDER_ERROR,
        severity=Severity.CRITICAL,
        message="order o-1 in Error",
        at=t - timedelta(hours=1),
        order_id="o-1",
    )
    new = Alert(
        alert_id="a2",
        kind=AlertKind.POISON_MESSAGE,
        severity=Severity.WARNING,
        message="malformed body",
        at=t,
        source="submission",
        data={"queue": "x.orders"},
    )
    assert await store.raise_alert(old)
    assert await store.raise_alert(new)
    assert not await store.raise_alert(old)
    assert await store.list_alerts() == [new, old]
    assert await store.list_alerts(since=t - timedelta(minutes=1)) == [new]
    assert await store.list_alerts(limit=1) == [new]


def _alert(alert_id: str, at: datetime) -> Alert:
    return Alert(
        alert_id=alert_id,
        kind=AlertKind.ORDER_ERROR,
        severity=Severity.CRITICAL,
        message=f"alert {alert_id}",
        at=at,
        order_id="o-1",
    )


async def test_an_alert_is_acknowledged_and_resolved_once_by_whoever_was_first(
    store: StateStore,
) -> None:
    t = utcnow().replace(microsecond=0)
    alert = _alert("a1", t - timedelta(hours=1))
    await store.raise_alert(alert)
    await store.raise_alert(_alert("a2", t))
    assert (await store.alert_states(["a1", "a2", "nope"])).keys() == {"a1", "a2"}
    fresh = (await store.alert_states(["a1"]))["a1"]
    assert fresh.acknowledged_at is None and fresh.resolved_at is None
    assert await store.changed_alerts(since=t - timedelta(days=1), limit=10) == []

    acked = await store.mark_alert("a1", AlertAction.ACKNOWLEDGE, by="ann", at=t)
    assert acked is not None and (acked.acknowledged_by, acked.acknowledged_at) == ("ann", t)
    again = await store.mark_alert(
        "a1", AlertAction.ACKNOWLEDGE, by="bob", at=t + timedelta(minutes=1)
    )
    assert again == acked, "the first acknowledgement stands"
    later = t + timedelta(minutes=5)
    resolved = await store.mark_alert("a1", AlertAction.RESOLVE, by="bob", at=later)
    assert resolved is not None and (resolved.resolved_by, resolved.resolved_at) == ("bob", later)
    assert resolved.acknowledged_by == "ann"
    assert await store.mark_alert("nope", AlertAction.RESOLVE, by="bob", at=t) is None

    assert await store.alert_states(["a1"]) == {"a1": resolved}
    assert await store.changed_alerts(since=t, limit=10) == [(alert, resolved)]
    assert await store.changed_alerts(since=later + timedelta(seconds=1), limit=10) == []
    # The alert itself is as raised: its state is kept beside it.
    assert alert in await store.list_alerts()


async def test_changed_alerts_come_oldest_change_first(store: StateStore) -> None:
    t = utcnow().replace(microsecond=0)
    for i in range(3):
        await store.raise_alert(_alert(f"c{i}", t))
    await store.mark_alert("c2", AlertAction.RESOLVE, by="x", at=t + timedelta(seconds=1))
    await store.mark_alert("c0", AlertAction.ACKNOWLEDGE, by="x", at=t + timedelta(seconds=2))
    await store.mark_alert("c1", AlertAction.ACKNOWLEDGE, by="x", at=t + timedelta(seconds=3))
    changed = await store.changed_alerts(since=t, limit=2)
    assert [a.alert_id for a, _ in changed] == ["c2", "c0"]


async def test_changed_alerts_page_through_many_changed_at_one_time(store: StateStore) -> None:
    t = utcnow().replace(microsecond=0)
    ids = [f"p{i}" for i in range(5)]
    for alert_id in ids:
        await store.raise_alert(_alert(alert_id, t))
        await store.mark_alert(alert_id, AlertAction.RESOLVE, by="x", at=t)  # one command
    await store.raise_alert(_alert("later", t))
    await store.mark_alert("later", AlertAction.RESOLVE, by="x", at=t + timedelta(seconds=1))
    seen: list[str] = []
    since, after = t - timedelta(hours=1), None
    while page := await store.changed_alerts(since=since, limit=2, after=after):
        seen += [a.alert_id for a, _ in page]
        last_alert, last_state = page[-1]
        assert last_state.changed_at is not None
        since, after = last_state.changed_at, last_alert.alert_id
    assert seen == [*ids, "later"], "each once, in order, none skipped"


async def test_alerts_page_newest_first_through_many_raised_at_one_time(
    store: StateStore,
) -> None:
    t = utcnow().replace(microsecond=0)
    raised = [("old", t - timedelta(hours=2)), ("new", t + timedelta(seconds=1))]
    raised += [(f"t{i}", t) for i in (3, 0, 4, 1, 2)]  # one time, a page ends among them
    for alert_id, at in raised:
        await store.raise_alert(_alert(alert_id, at))
    for since, expected in [
        (None, ["new", "t0", "t1", "t2", "t3", "t4", "old"]),
        (t - timedelta(hours=1), ["new", "t0", "t1", "t2", "t3", "t4"]),
    ]:
        seen: list[str] = []
        after: AlertCursor | None = None
        while page := await store.list_alerts(since=since, limit=2, after=after):
            assert len(page) <= 2
            seen += [a.alert_id for a in page]
            after = AlertCursor(page[-1].at, page[-1].alert_id)
        assert seen == expected, "each once, newest first, none skipped"
        assert [a.alert_id for a in await store.list_alerts(since=since)] == expected


async def test_inbox_claims_are_reentrant_for_their_holder(store: StoreUnderTest) -> None:
    now = utcnow()
    claim = {"now": now, "claim_until": now + timedelta(seconds=30)}
    assert await store.inbox_claim("q", "m-re", holder="a", **claim) is InboxOutcome.CLAIMED
    assert await store.inbox_claim("q", "m-re", holder="a", **claim) is InboxOutcome.CLAIMED
    assert await store.inbox_claim("q", "m-re", holder="b", **claim) is InboxOutcome.BUSY
    await store.inbox_complete("q", "m-re", holder="a", keep_until=now + timedelta(hours=1))
    assert await store.inbox_claim("q", "m-re", holder="a", **claim) is InboxOutcome.DUPLICATE


async def test_component_statuses_are_replaced_listed_until_they_expire_and_forgotten(
    store: StateStore,
) -> None:
    now = utcnow()

    def status(name: str, kind: str, ttl: float, **data: object) -> ComponentStatus:
        return ComponentStatus(
            name=name,
            kind=kind,
            at=now,
            expires_at=now + timedelta(seconds=ttl),
            data=dict(data),
        )

    await store.report_status(status("payment-1", "agent-payment", 10, open_breakers=[]))
    await store.report_status(status("sched-1", "scheduler", 10, inflight=3))
    await store.report_status(status("gone-1", "scheduler", -1))
    await store.report_status(
        status("payment-1", "agent-payment", 10, open_breakers=["payment.charge"])
    )
    listed = await store.list_status(now=now)
    assert [(s.kind, s.name) for s in listed] == [
        ("agent-payment", "payment-1"),
        ("scheduler", "sched-1"),
    ]
    assert listed[0].data == {"open_breakers": ["payment.charge"]}
    await store.forget_status("sched-1")
    assert [s.name for s in await store.list_status(now=now)] == ["payment-1"]
    assert await store.list_status(now=now + timedelta(seconds=11)) == []


async def test_an_update_carries_its_history_and_undo_only_when_it_matches(
    store: StateStore,
) -> None:
    order, state = order_pair("o-carry")
    await store.insert_order(order, state)
    t = utcnow()
    events = [
        HistoryEvent(
            order_id="o-carry", type=H.STEP_SCHEDULED, at=t, step="reserve", data={"n": 1}
        ),
        HistoryEvent(order_id="o-carry", type=H.STEP_COMPLETED, at=t, step="reserve"),
    ]
    undo = undo_entry("o-carry", "reserve", at=t)
    missed = await store.update_state(
        "o-carry",
        Expect(locked_by="someone-else"),
        Changes(fields={"updated_at": t}),
        history=events,
        compensation=undo,
    )
    assert missed is None
    assert await store.read_history("o-carry") == []
    assert await store.read_compensation("o-carry") == []

    hit = await store.update_state(
        "o-carry", Expect(), Changes(fields={"updated_at": t}), history=events, compensation=undo
    )
    assert hit is not None
    history = await store.read_history("o-carry")
    assert [(e.type, e.data) for e in history] == [
        (H.STEP_SCHEDULED, {"n": 1}),
        (H.STEP_COMPLETED, {}),
    ]
    [logged] = await store.read_compensation("o-carry")
    assert (logged.step, logged.undo) == ("reserve", "inventory.release")
    assert logged.status is UndoStatus.PENDING
    # The undo is insert-if-absent: a second carry changes nothing.
    same = Changes(fields={"updated_at": t})
    await store.update_state("o-carry", Expect(), same, compensation=undo)
    assert len(await store.read_compensation("o-carry")) == 1


async def test_history_many_appends_in_order(store: StateStore) -> None:
    await _recorded(store, "o-many0", "o-many1")
    t = utcnow()
    events = [
        HistoryEvent(order_id=f"o-many{i % 2}", type=H.EXECUTION_STARTED, at=t, attempt=i)
        for i in range(6)
    ]
    await store.append_history_many(events)
    await store.append_history_many([])
    assert [e.attempt for e in await store.read_history("o-many0")] == [0, 2, 4]
    assert [e.attempt for e in await store.read_history("o-many1")] == [1, 3, 5]


async def _finish(store: StateStore, order_id: str, state: ProcessState, at: datetime) -> None:
    changes = Changes(fields={"process_state": state, "updated_at": at})
    assert await store.update_state(order_id, Expect(), changes) is not None


async def test_workflow_usage_counts_records_per_version_and_state(store: StateStore) -> None:
    for i in range(3):
        order, state = order_pair(f"o-v1-{i}")
        await store.insert_order(order, state)
    order, state = order_pair("o-v2")
    await store.insert_order(order, state.model_copy(update={"workflow_version": 2}))
    await _finish(store, "o-v1-0", ProcessState.PROCESSED, utcnow())

    usage = {(u.workflow, u.version, u.state): u.count for u in await store.workflow_usage()}
    assert usage == {
        ("order", 1, ProcessState.PENDING): 2,
        ("order", 1, ProcessState.PROCESSED): 1,
        ("order", 2, ProcessState.PENDING): 1,
    }


async def test_journal_records_keep_the_schema_version_they_were_written_with(
    store: StoreUnderTest,
) -> None:
    await _recorded(store, "o-sv")
    t = utcnow()
    # A later build's layout (v2) must come back as v2, not as the store's default.
    event = HistoryEvent(order_id="o-sv", type=H.ORDER_SUBMITTED, at=t, schema_version=2)
    await store.append_history_many([event])
    undo = CompensationEntry(
        order_id="o-sv",
        step="reserve",
        undo="inventory.release",
        idempotency_key="o-sv:reserve:undo",
        recorded_at=t,
        schema_version=2,
    )
    await store.append_compensation(undo)
    alert = Alert(
        alert_id="a-sv",
        kind=AlertKind.ORDER_ERROR,
        severity=Severity.CRITICAL,
        message="m",
        at=t,
        schema_version=2,
    )
    await store.raise_alert(alert)
    assert [e.schema_version for e in await store.read_history("o-sv")] == [2]
    assert [e.schema_version for e in await store.read_compensation("o-sv")] == [2]
    assert [a.schema_version for a in await store.list_alerts() if a.alert_id == "a-sv"] == [2]
    assert HistoryEvent(order_id="o", type=H.ORDER_SUBMITTED, at=t).schema_version == 1


async def test_concurrent_inbox_calls_of_one_process_keep_their_order(store: StateStore) -> None:
    """Claims, completions and attempt tickets made side by side (a PostgreSQL store sends them
    in shared round trips): each call ends as it would have alone, in the order made."""
    now = utcnow()
    until = now + timedelta(seconds=30)
    keep = now + timedelta(hours=1)
    first, _, ticket, second, again = await asyncio.gather(
        store.inbox_claim_many(
            "q", [InboxClaim("a", "h1", until), InboxClaim("b", "h1", until)], now=now
        ),
        store.inbox_complete_many("q", [InboxDone("a", "h1", keep)]),
        store.inbox_claim_many("q:attempts", [InboxClaim("a#1", "t1", keep)], now=now),
        store.inbox_claim_many(
            "q", [InboxClaim("a", "h2", until), InboxClaim("b", "h2", until)], now=now
        ),
        store.inbox_claim_many("q:attempts", [InboxClaim("a#1", "t2", keep)], now=now),
    )
    assert first == [InboxOutcome.CLAIMED, InboxOutcome.CLAIMED]
    assert ticket == [InboxOutcome.CLAIMED]
    assert second == [InboxOutcome.DUPLICATE, InboxOutcome.BUSY]
    assert again == [InboxOutcome.BUSY]


async def test_processes_writing_the_same_ids_in_crossing_order_never_deadlock(
    store: StateStore, hub: str
) -> None:
    """Four PostgreSQL stores (four processes' pools) claiming and completing the same ids in
    crossing order, their calls sent in shared round trips: every id is claimed once, and no
    statement deadlocks."""
    if store.kind != "postgresql":
        pytest.skip("the round trips shared between calls are PostgreSQL's")
    others = [
        await PostgresStore.connect(
            POSTGRES_URL, hub, pool_size=2, timeout=5.0, command_timeout=10.0
        )
        for _ in range(3)
    ]
    try:
        now = utcnow()
        until = now + timedelta(seconds=30)
        keep = now + timedelta(hours=1)
        for attempt in range(5):
            ids = [f"y{attempt}-{i:03}" for i in range(200)]
            done_ids = [f"d{attempt}-{i:03}" for i in range(200)]
            calls = []
            for j, s in enumerate([store, *others] * 2):
                order = ids if j % 2 else ids[::-1]
                calls.append(
                    s.inbox_claim_many(
                        "q", [InboxClaim(m, f"h-{j}", until) for m in order], now=now
                    )
                )
                calls.append(
                    s.inbox_complete_many(
                        "q",
                        [
                            InboxDone(m, f"k-{j}", keep)
                            for m in (done_ids if j % 2 else done_ids[::-1])
                        ],
                    )
                )
            results = await asyncio.gather(*calls)
            claimed = results[0::2]
            for m in ids:
                winners = [r[(ids if j % 2 else ids[::-1]).index(m)] for j, r in enumerate(claimed)]
                assert winners.count(InboxOutcome.CLAIMED) == 1, (m, winners)
    finally:
        for other in others:
            await other.close()


async def test_a_completion_alone_is_written_and_its_id_is_then_a_duplicate(
    store: StateStore,
) -> None:
    """A completion with no claim to go with (PostgreSQL holds it a moment for one:
    decision:completion-waits-for-claim-postgresql) is still written, and soon: a claim of its id by
    another holder then finds it done."""
    now = utcnow()
    until = now + timedelta(seconds=30)
    assert await store.inbox_claim_many("q", [InboxClaim("a", "h1", until)], now=now) == [
        InboxOutcome.CLAIMED
    ]
    await asyncio.wait_for(
        store.inbox_complete_many("q", [InboxDone("a", "h1", now + timedelta(hours=1))]), 2.0
    )
    again = await store.inbox_claim_many("q", [InboxClaim("a", "h2", until)], now=utcnow())
    assert again == [InboxOutcome.DUPLICATE]


async def test_a_claim_of_an_id_whose_completion_waits_finds_it_done(store: StateStore) -> None:
    """The completion of an id and, made while it waits to go, another holder's claim of the
    same id: the completion goes first (PostgreSQL's round trips keep the order of calls on
    one id; the memory store is sequential), so the claim is a duplicate, never a second
    handling. MongoDB sends them over pooled connections, in either order: not a case of it."""
    if store.kind not in ("postgresql", "memory"):
        pytest.skip("two concurrent calls on one id are ordered by PostgreSQL's batcher only")
    completing, until = await _claimed_then_completing(store)
    claimed = await store.inbox_claim_many("q", [InboxClaim("a", "h2", until)], now=utcnow())
    await completing
    assert claimed == [InboxOutcome.DUPLICATE]


async def test_a_completion_goes_in_the_round_trip_of_the_next_claim(
    store: StateStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PostgreSQL: a completion waits for a claim to go with instead of taking a round trip
    (and a commit) of its own; a claim made meanwhile takes it along, whatever their queues."""
    if store.kind != "postgresql":
        pytest.skip("the round trips shared between calls are PostgreSQL's")
    round_trips: list[int] = []
    write = store._write_entries  # type: ignore[attr-defined]

    async def counted(calls: Sequence[object]) -> list[set[str]]:
        round_trips.append(len(calls))
        result: list[set[str]] = await write(calls)
        return result

    monkeypatch.setattr(store, "_write_entries", counted)
    monkeypatch.setattr(store, "_round_trips", None)  # a batcher that flushes through the spy
    completing, until = await _claimed_then_completing(store)
    ticket = await store.inbox_claim_many(
        "q:attempts", [InboxClaim("b#1", "t1", until)], now=utcnow()
    )
    await asyncio.wait_for(completing, 5.0)
    assert ticket == [InboxOutcome.CLAIMED]
    assert round_trips == [1, 2], "the claim, then the completion and the ticket together"
    again = await store.inbox_claim_many("q", [InboxClaim("a", "h2", until)], now=utcnow())
    assert again == [InboxOutcome.DUPLICATE]


@pytest.mark.parametrize("caller", ["waiting", "gone"])
async def test_a_store_closing_writes_the_completions_still_waiting(
    store: StateStore, hub: str, caller: str
) -> None:
    """PostgreSQL: a process that stops while a completion waits for a claim to go with still
    writes it before its pool closes: whether its caller still waits for it, or has gone (a
    handling cancelled by a drain, a notifier's task), when nothing else waits for the write."""
    if store.kind != "postgresql":
        pytest.skip("only PostgreSQL holds completions back")
    closing = await PostgresStore.connect(
        POSTGRES_URL, hub, pool_size=2, timeout=5.0, command_timeout=10.0
    )
    completing, until = await _claimed_then_completing(closing)
    if caller == "gone":
        completing.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await completing
    await closing.close()
    if caller == "waiting":
        await asyncio.wait_for(completing, 5.0)
    again = await store.inbox_claim_many("q", [InboxClaim("a", "h2", until)], now=utcnow())
    assert again == [InboxOutcome.DUPLICATE]


async def _claimed_then_completing(
    store: StateStore,
) -> tuple[asyncio.Task[None], datetime]:
    """Message id "a" of queue "q" claimed by h1, then its completion made (and, on
    PostgreSQL, waiting for a claim to go with); the completion's task, and the claims'
    expiry."""
    now = utcnow()
    until = now + timedelta(seconds=30)
    await store.inbox_claim_many("q", [InboxClaim("a", "h1", until)], now=now)
    completing = asyncio.create_task(
        store.inbox_complete_many("q", [InboxDone("a", "h1", now + timedelta(hours=1))])
    )
    await asyncio.sleep(0)  # the completion task runs up to its wait; then the caller goes on
    if store.kind == "postgresql":
        assert store._lingering, "the completion waits for a claim"  # type: ignore[attr-defined]
    return completing, until


async def test_no_reader_sees_a_transition_without_the_journal_it_carries(
    store: StateStore,
) -> None:
    """Issue 35, hazard 1: a compensator that finds a step started must find its undo logged.
    The MongoDB adapter once wrote the state record, then the undo with three more round
    trips: a reader in between saw the step started and an empty undo log, undid nothing,
    and the step acted after the order was Compensated."""
    await _recorded(store, "o-seen")
    t = utcnow()
    undo = undo_entry("o-seen", "reserve", at=t)
    started = HistoryEvent(order_id="o-seen", type=H.STEP_SCHEDULED, at=t, step="reserve")
    before = len(await store.read_history("o-seen"))
    seen: list[tuple[int, int]] = []
    writing = True

    async def observe() -> None:
        while writing:
            record = await store.get_state("o-seen")
            assert record is not None
            if record.locked_by == "o-seen:1":
                history = len(await store.read_history("o-seen")) - before
                seen.append((history, len(await store.read_compensation("o-seen"))))
            await asyncio.sleep(0)

    observer = asyncio.create_task(observe())
    await asyncio.sleep(0)
    start = Changes(fields={"locked_by": "o-seen:1", "updated_at": t})
    for _ in range(3):  # the observer gets in between wherever a write yields
        await asyncio.sleep(0)
    after = await store.update_state(
        "o-seen", Expect(locked_by=None), start, history=[started], compensation=undo
    )
    for _ in range(20):  # and reads what the write left
        await asyncio.sleep(0)
    writing = False
    await observer
    assert after is not None and seen, "the observer never saw the transition"
    assert set(seen) == {(1, 1)}, f"a reader saw the transition without its journal: {seen}"
