"""Contract, searched: any sequence of transitions carrying journal entries leaves every store
where the reference store (memory) is, transition by transition.

decision:mongodb-transition-one-write made a MongoDB transition one write whose filter holds the
undo log's conditions
(insert-if-absent, Done is final), with a second write when only those failed; this asks
hypothesis for the sequences nobody wrote down: a step started twice, an undo marked before it
was logged, after it was Done, by a superseded fence.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shared.domain.journal import CompensationEntry, HistoryEvent, HistoryEventType, UndoStatus
from shared.domain.timing import utcnow
from shared.domain.updates import Changes, Expect
from shared.store.memory import MemoryStore
from shared.store.port import StateStore, UndoMark
from tests.support.factories import order_pair

LOCKS = [None, "a", "b"]
STEPS = ["reserve", "charge", "ship"]


@dataclass(frozen=True)
class Op:
    expect: str | bool | None
    """The lock the write expects (False: any)."""
    lock: str | None
    events: int
    logs: str | None
    """A step whose undo the write logs."""
    marks: tuple[str, UndoStatus] | None


OPS = st.builds(
    Op,
    expect=st.sampled_from([False, *LOCKS]),
    lock=st.sampled_from(LOCKS),
    events=st.integers(min_value=0, max_value=3),
    logs=st.one_of(st.none(), st.sampled_from(STEPS)),
    marks=st.one_of(st.none(), st.tuples(st.sampled_from(STEPS), st.sampled_from(UndoStatus))),
).filter(lambda op: op.logs is None or op.marks is None)  # the port takes one or the other


async def _apply(store: StateStore, order_id: str, op: Op, n: int) -> Any:
    t = utcnow().replace(microsecond=0) + timedelta(seconds=n)
    history = [
        HistoryEvent(order_id=order_id, type=HistoryEventType.STEP_FAILED, at=t, attempt=n, step=s)
        for s in STEPS[: op.events]
    ]
    compensation = None
    if op.logs is not None:
        compensation = CompensationEntry(
            order_id=order_id,
            step=op.logs,
            undo=f"{op.logs}.undo",
            idempotency_key=f"{order_id}:{op.logs}:undo",
            recorded_at=t,
        )
    undo = None
    if op.marks is not None:
        step, status = op.marks
        undo = UndoMark(step, status, t, None if status is UndoStatus.DONE else f"e{n}")
    expect = Expect() if op.expect is False else Expect(locked_by=op.expect)
    changes = Changes(fields={"locked_by": op.lock, "updated_at": t})
    after = await store.update_state(
        order_id, expect, changes, history=history, compensation=compensation, undo=undo
    )
    return None if after is None else after.locked_by


async def _seen(store: StateStore, order_id: str) -> Any:
    record = await store.get_state(order_id)
    assert record is not None
    events = await store.read_history(order_id)
    seqs = [e.seq or 0 for e in events]
    assert seqs == sorted(set(seqs)), "numbered in order, once each (the numbers are the store's)"
    history = [(e.type, e.attempt, e.step) for e in events]
    undos = [
        (u.step, u.undo, u.status, u.done_at, u.error)
        for u in await store.read_compensation(order_id)
    ]
    return record.locked_by, history, undos


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(ops=st.lists(OPS, min_size=1, max_size=12))
async def test_every_store_keeps_the_journal_as_the_reference_does(
    store: StateStore, ops: list[Op]
) -> None:
    reference = MemoryStore()
    order_id = f"o-p-{uuid.uuid4().hex[:8]}"
    order, state = order_pair(order_id)
    for s in (reference, store):
        await s.insert_order(order, state)
    for n, op in enumerate(ops, start=1):
        expected = await _apply(reference, order_id, op, n)
        assert await _apply(store, order_id, op, n) == expected, (n, op)
        assert await _seen(store, order_id) == await _seen(reference, order_id), (n, op)
