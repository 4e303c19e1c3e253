"""The leader's gauges: orders per state and queue depths, refreshed every supervisor round.

Only the leader publishes them, so that summing over every supervisor counts each order and each
message once; a supervisor that loses the lease clears its own. Reading them must never hold up
recovery: each refresh is bounded in time, and a failure only leaves the gauges out until the
next round.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from shared.broker.port import Connection, QueueAdmin, QueueMissing
from shared.broker.topology import Names
from shared.domain.states import ProcessState
from shared.metrics import ORDERS, QUEUE_DEPTH
from shared.store.port import StateQueries

log = logging.getLogger(__name__)

REFRESH_TIMEOUT_S = 5.0
"""Upper bound on reading every queue's depth once."""


class LeaderGauges:
    def __init__(self, store: StateQueries, connection: Connection, names: Names) -> None:
        self._store = store
        self._connection = connection
        self._queues = [q for base in names.input_queues() for q in (base, names.dlq(base))]
        self._queues.append(names.alert_feed)  # notifications waiting for their reader
        self._admin: QueueAdmin | None = None

    async def refresh(self) -> None:
        counts = await self._store.count_by_state()
        for state in ProcessState:
            ORDERS.labels(state.value).set(counts.get(state, 0))
        try:
            async with asyncio.timeout(REFRESH_TIMEOUT_S):
                for queue in self._queues:
                    await self._read_depth(queue)
        except Exception as exc:  # the broker is slow or away: try again next round
            log.info("could not read queue depths", extra={"error": repr(exc)})
            await self._drop_channel()

    async def _read_depth(self, queue: str) -> None:
        if self._admin is None:
            self._admin = await self._connection.admin()
        try:
            depth = await self._admin.depth(queue)
        except QueueMissing:  # not declared (`orderflow init` was not run)
            with contextlib.suppress(KeyError):
                QUEUE_DEPTH.remove(queue)
            return
        QUEUE_DEPTH.labels(queue).set(depth)

    async def _drop_channel(self) -> None:
        admin, self._admin = self._admin, None
        if admin is not None:
            with contextlib.suppress(Exception):
                await admin.close()

    async def clear(self) -> None:
        """Leadership lost: these gauges are another supervisor's to publish now."""
        ORDERS.clear()
        QUEUE_DEPTH.clear()
        await self._drop_channel()
