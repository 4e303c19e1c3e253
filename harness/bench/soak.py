"""`orderflow bench --soak`: a long run with retention purging as it goes (issue 14).

The topology runs with short retention settings, so that the supervisor leader's purges delete
finished orders, their journals, inbox entries and alerts while orders still flow; the run ends
once every order published has settled or been purged, and reports every table's row count and
every durable queue's depth at the end, beside the largest each reached (sampled), and what the
purges did (from the supervisors' heartbeats). Bounded means: the peaks follow the retention
windows and the rate, not the number of orders.
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass, field
from typing import Any

from harness.bench.load import Progress, raise_if_failed
from shared.bootstrap import open_broker
from shared.broker.port import Connection
from shared.broker.topology import Names, queue_depths
from shared.config import Settings
from shared.domain.states import SETTLED_STATES, ProcessState
from shared.domain.timing import utcnow
from shared.store.port import StateStore

SOAK_ENV = {
    "ORDERFLOW_INBOX_TTL_S": "30",
    "ORDERFLOW_RETENTION_S": "30",
    "ORDERFLOW_ORDER_RETENTION_S": "60",
    "ORDERFLOW_ALERT_RETENTION_S": "60",
    "ORDERFLOW_RETENTION_INTERVAL_S": "5",
    "ORDERFLOW_HEARTBEAT_S": "1",
}
"""A soak's retention: short enough that purges run many times within a few minutes. A value
set in the environment wins."""
SAMPLE_S = 5.0
"""How often the sizes are sampled for their peaks."""
POLL_S = 0.5
UNSETTLED = frozenset(ProcessState) - SETTLED_STATES
"""Orders some process still has to move: pending or held by an attempt."""


def soak_env() -> dict[str, str]:
    return {name: os.environ.get(name, value) for name, value in SOAK_ENV.items()}


async def retention_totals(store: StateStore) -> dict[str, dict[str, int]]:
    """What the supervisors' purges did, summed over their heartbeats: `passes` and `batches`
    per purge, `deleted` per kind of record."""
    totals: dict[str, dict[str, int]] = {"passes": {}, "batches": {}, "deleted": {}}
    for status in await store.list_status(now=utcnow()):
        if status.kind != "supervisor":
            continue
        retention = status.data.get("retention") or {}
        for part, counts in totals.items():
            for name, n in (retention.get(part) or {}).items():
                counts[name] = counts.get(name, 0) + int(n)
    return totals


@dataclass
class Sizes:
    """Row counts and queue depths: the last sample and the largest of each."""

    rows: dict[str, int] = field(default_factory=dict)
    rows_peak: dict[str, int] = field(default_factory=dict)
    queues: dict[str, int] = field(default_factory=dict)
    queues_peak: dict[str, int] = field(default_factory=dict)
    samples: int = 0

    def add(self, rows: dict[str, int], queues: dict[str, int]) -> None:
        self.rows, self.queues = rows, queues
        for name, n in rows.items():
            self.rows_peak[name] = max(n, self.rows_peak.get(name, 0))
        for name, n in queues.items():
            self.queues_peak[name] = max(n, self.queues_peak.get(name, 0))
        self.samples += 1


class Soak:
    def __init__(self, settings: Settings, store: StateStore) -> None:
        self._settings = settings
        self._store = store
        self._names = Names(settings.hub)
        self.sizes = Sizes()

    async def sample(self, connection: Connection) -> None:
        depths = await queue_depths(connection, self._names.durable_queues())
        unread = [queue for queue, depth in depths.items() if depth is None]
        if unread:  # a zero would hide the growth the soak is there to see
            raise RuntimeError(f"the soak could not read the depth of {', '.join(unread)}")
        self.sizes.add(
            await self._store.record_counts(),
            {queue: depth for queue, depth in depths.items() if depth is not None},
        )

    async def wait(
        self,
        orders: int,
        timeout: float,
        progress: Progress | None = None,
        publishing: asyncio.Task[None] | None = None,
    ) -> int:
        """Until every order published has settled or been purged, sampling the sizes; how
        many did. An order counts as purged once a supervisor's heartbeat says so, and the
        heartbeats are read before the states, so no order is counted twice. A publisher that
        failed ends the wait with its error."""
        connection = await open_broker(self._settings, name="orderflow-soak")
        give_up = time.monotonic() + timeout
        next_sample = 0.0
        try:
            while True:
                if time.monotonic() >= next_sample:
                    await self.sample(connection)
                    next_sample = time.monotonic() + SAMPLE_S
                purged = (await retention_totals(self._store))["deleted"].get("orders", 0)
                counts = await self._store.count_by_state()
                done = purged + sum(counts[s] for s in SETTLED_STATES)
                if progress is not None:
                    progress("orders settled or purged", done, orders)
                live = sum(counts[s] for s in UNSETTLED)
                if (done >= orders and not live) or time.monotonic() > give_up:
                    await self.sample(connection)
                    return done
                raise_if_failed(publishing)
                await asyncio.sleep(POLL_S)
        finally:
            await connection.close()

    async def result(self) -> dict[str, Any]:
        return {
            "retention_settings": soak_env(),
            "rows": self.sizes.rows,
            "rows_peak": self.sizes.rows_peak,
            "queues": self.sizes.queues,
            "queues_peak": self.sizes.queues_peak,
            "samples": self.sizes.samples,
            "retention": await retention_totals(self._store),
        }
