"""The leader's retention schedule (services/supervisor/retention.py), on a fake store and a
fake clock: bounded batches, a backlog carried to the next round, an interval otherwise."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any, cast

import pytest

from services.supervisor.retention import BATCHES_PER_ROUND, Retention
from shared.config import Settings
from shared.domain.timing import utcnow
from shared.metrics import exposition
from shared.store.port import Purged, StateStore


class Backlog:
    """As many expired records of each kind as given; each purge call takes up to its limit."""

    def __init__(self, **left: int) -> None:
        self.left = {"inbox": 0, "history": 0, "orders": 0, "alerts": 0} | left
        self.calls: list[tuple[str, int, datetime]] = []

    def _take(self, kind: str, limit: int, cutoff: datetime) -> int:
        self.calls.append((kind, limit, cutoff))
        n = min(limit, self.left[kind])
        self.left[kind] -= n
        return n

    async def inbox_purge(self, *, now: datetime, limit: int) -> int:
        return self._take("inbox", limit, now)

    async def purge_journal(self, *, finished_before: datetime, limit: int) -> Purged:
        return Purged(history=self._take("history", limit, finished_before))

    async def purge_orders(self, *, finished_before: datetime, limit: int) -> Purged:
        return Purged(orders=self._take("orders", limit, finished_before))

    async def purge_alerts(self, *, raised_before: datetime, limit: int) -> int:
        return self._take("alerts", limit, raised_before)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def retention(store: Backlog, clock: Clock, **settings: Any) -> Retention:
    values = {"retention_batch": 10, "retention_interval_s": 60.0} | settings
    s = Settings(**values)
    skew = s.process.clock_skew_s
    return Retention(cast(StateStore, store), s.retention, clock_skew_s=skew, clock=clock)


def kinds(store: Backlog) -> list[str]:
    return [kind for kind, _, _ in store.calls]


async def test_each_purge_runs_one_batch_when_little_has_expired_then_waits_the_interval() -> None:
    store, clock = Backlog(inbox=3, orders=1), Clock()
    r = retention(store, clock)
    await r.run_due()
    assert kinds(store) == ["inbox", "history", "orders", "alerts"]
    assert r.counts.deleted == {
        "inbox": 3,
        "history": 0,
        "compensation_log": 0,
        "orders": 1,
        "alerts": 0,
    }
    clock.now += 59
    await r.run_due()
    assert len(store.calls) == 4, "nothing is due before the interval"
    clock.now += 1
    await r.run_due()
    assert len(store.calls) == 8


async def test_a_backlog_is_deleted_in_bounded_batches_a_few_per_round() -> None:
    store, clock = Backlog(inbox=10 * BATCHES_PER_ROUND + 7), Clock()
    r = retention(store, clock)
    await r.run_due()
    inbox = [limit for kind, limit, _ in store.calls if kind == "inbox"]
    assert inbox == [10] * BATCHES_PER_ROUND, "every batch full: stop at the round's share"
    await r.run_due()  # the very next round, not an interval later: the backlog goes on
    inbox = [kind for kind in kinds(store) if kind == "inbox"]
    assert len(inbox) == BATCHES_PER_ROUND + 1 and store.left["inbox"] == 0
    assert r.counts.passes["inbox"] == 2 and r.counts.passes["orders"] == 1
    assert r.counts.batches["inbox"] == BATCHES_PER_ROUND + 1


async def test_cutoffs_follow_each_retention_and_the_inbox_allows_for_clock_skew() -> None:
    store, clock = Backlog(), Clock()
    r = retention(
        store,
        clock,
        clock_skew_s=2.0,
        retention_s=100.0,
        order_retention_s=1000.0,
        alert_retention_s=50.0,
    )
    before = utcnow()
    await r.run_due()
    after = utcnow()
    expected = {"inbox": 2.0, "history": 100.0, "orders": 1000.0, "alerts": 50.0}
    for kind, _, cutoff in store.calls:
        age = timedelta(seconds=expected[kind])
        assert before - age <= cutoff <= after - age, kind


@pytest.mark.parametrize("name", ["orderflow_retention_deleted", "orderflow_retention_batches"])
def test_retention_metrics_are_exposed(name: str) -> None:
    assert f"# TYPE {name}_total counter" in exposition().decode()
