"""Retention: the supervisor leader deletes what expired, in bounded batches (issue 14).

Four purges, each on its own schedule:

| purge     | deletes                                              | once past             |
|-----------|------------------------------------------------------|-----------------------|
| `inbox`   | inbox entries past their expiry (handled, lapsed)    | their expiry + skew   |
| `journal` | history and compensation log of finished orders      | `retention_s`         |
| `orders`  | finished orders: order, state record and journal     | `order_retention_s`   |
| `alerts`  | stored alerts                                        | `alert_retention_s`   |

"Finished" is Processed or Compensated: parked (Error, CompensationFailed) and live orders are
never purged. Each statement deletes at most `retention_batch` records, and a purge runs at
most `BATCHES_PER_ROUND` of them per supervisor round, so recovery never waits long behind it.
A purge that finds less than a full batch is done until `retention_interval_s` from now; one
whose batches all came back full (a backlog) goes on at the next round.

Only the leader runs it (it is part of the leader's round), but nothing depends on that: every
batch is a conditional delete of what has expired, which two supervisors may run at once.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from shared import clock
from shared.config import RetentionSettings
from shared.domain.timing import utcnow
from shared.metrics import RETENTION_BATCHES, RETENTION_DELETED
from shared.store.port import Purges

log = logging.getLogger(__name__)

BATCHES_PER_ROUND = 5


@dataclass
class Purge:
    """One kind of expired record, and when it is next due (monotonic seconds)."""

    name: str
    batch: Callable[[int], Awaitable[dict[str, int]]]
    """Delete one batch of at most this many; the records deleted, by kind."""
    unit: str
    """The kind whose count says whether a batch was full."""
    also: tuple[str, ...] = ()
    """Other kinds a full batch of which means more is waiting."""
    due: float = 0.0


@dataclass
class RetentionCounts:
    """What the purges did since this supervisor started (its heartbeat shows them)."""

    passes: dict[str, int] = field(default_factory=dict)
    """Rounds in which each purge ran."""
    batches: dict[str, int] = field(default_factory=dict)
    deleted: dict[str, int] = field(default_factory=dict)
    """Records deleted, by kind (`orders`: an order record with its state record)."""

    def as_dict(self) -> dict[str, Any]:
        return {"passes": self.passes, "batches": self.batches, "deleted": self.deleted}


class Retention:
    def __init__(
        self,
        store: Purges,
        settings: RetentionSettings,
        *,
        clock_skew_s: float,
        clock: Callable[[], float] = clock.monotonic,
    ) -> None:
        self._store = store
        self._s = settings
        self._skew = timedelta(seconds=clock_skew_s)
        self._clock = clock
        self.counts = RetentionCounts()
        self.purges = [
            Purge("inbox", self._inbox, unit="inbox"),
            Purge("journal", self._journal, unit="history", also=("compensation_log",)),
            Purge("orders", self._orders, unit="orders"),
            Purge("alerts", self._alerts, unit="alerts"),
        ]

    async def run_due(self) -> None:
        """Run every purge that is due (at once after a supervisor takes the lead)."""
        for purge in self.purges:
            if self._clock() >= purge.due:
                await self._run(purge)

    async def _run(self, purge: Purge) -> None:
        limit = self._s.retention_batch
        total: dict[str, int] = {}
        self.counts.passes[purge.name] = self.counts.passes.get(purge.name, 0) + 1
        for _ in range(BATCHES_PER_ROUND):
            deleted = await purge.batch(limit)
            RETENTION_BATCHES.labels(purge.name).inc()
            self.counts.batches[purge.name] = self.counts.batches.get(purge.name, 0) + 1
            for kind, n in deleted.items():
                total[kind] = total.get(kind, 0) + n
                self.counts.deleted[kind] = self.counts.deleted.get(kind, 0) + n
                RETENTION_DELETED.labels(kind).inc(n)
            if all(deleted.get(kind, 0) < limit for kind in (purge.unit, *purge.also)):
                purge.due = self._clock() + self._s.retention_interval_s
                break
        # Otherwise every batch was full: a backlog, which the next round goes on with.
        if any(total.values()):
            log.info("retention", extra={"purge": purge.name, "deleted": total})

    async def _inbox(self, limit: int) -> dict[str, int]:
        # An entry's expiry was set by its consumer's clock: judge it by that clock at worst.
        now = utcnow() - self._skew
        return {"inbox": await self._store.inbox_purge(now=now, limit=limit)}

    async def _journal(self, limit: int) -> dict[str, int]:
        cutoff = utcnow() - timedelta(seconds=self._s.retention_s)
        purged = await self._store.purge_journal(finished_before=cutoff, limit=limit)
        return {"history": purged.history, "compensation_log": purged.compensation}

    async def _orders(self, limit: int) -> dict[str, int]:
        cutoff = utcnow() - timedelta(seconds=self._s.order_retention_s)
        purged = await self._store.purge_orders(finished_before=cutoff, limit=limit)
        return {
            "orders": purged.orders,
            "history": purged.history,
            "compensation_log": purged.compensation,
        }

    async def _alerts(self, limit: int) -> dict[str, int]:
        cutoff = utcnow() - timedelta(seconds=self._s.alert_retention_s)
        return {"alerts": await self._store.purge_alerts(raised_before=cutoff, limit=limit)}
