"""`orderflow stats` and `watch`: one snapshot of a hub across the store and the broker.

Orders per state, stuck Pending and overdue running orders (counted up to COUNT_CAP), queue
depths, the processes reporting, their open circuit breakers and intake, the supervisor leader.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from services.operator.results import Processes, ProcessRow, Stats
from shared.broker.port import Connection
from shared.broker.topology import Names, queue_depths
from shared.domain.coordination import SUPERVISOR_LEASE, ComponentStatus
from shared.domain.durations import human_age
from shared.domain.states import LIVE_STATES
from shared.domain.timing import utcnow
from shared.store.port import StateStore

COUNT_CAP = 1000
"""The most stuck Pending and overdue orders `stats` reads; beyond it, it says `1000+`."""


async def hub_stats(
    store: StateStore,
    connection: Connection,
    names: Names,
    *,
    stuck_after: timedelta,
    overdue_after: timedelta,
) -> Stats:
    """Orders per state, stuck and overdue orders, queue depths, running processes, open
    circuit breakers and the supervisor leader: one snapshot for `stats`, `watch` and
    `GET /ops/stats`. Stuck: Pending and due for longer than `stuck_after`; overdue: a
    deadline passed longer than `overdue_after` ago."""
    now = utcnow()
    by_state = await store.count_by_state()
    # One more than the cap, to tell "exactly the cap" from "more than the cap".
    stuck = await store.find_stuck_pending(due_before=now - stuck_after, limit=COUNT_CAP + 1)
    overdue = await store.scan_expired(
        now=now - overdue_after,
        states=LIVE_STATES,
        limit=COUNT_CAP + 1,
    )
    running = await process_stats(store, now=now)
    return Stats(
        hub=names.hub,
        at=now.isoformat(),
        by_state={state.value: n for state, n in by_state.items()},
        stuck_pending=[r.order_id for r in stuck[:COUNT_CAP]],
        stuck_pending_capped=len(stuck) > COUNT_CAP,
        overdue=[r.order_id for r in overdue.records[:COUNT_CAP]],
        overdue_capped=len(overdue.records) > COUNT_CAP,
        count_cap=COUNT_CAP,
        processes=running.processes,
        open_breakers=running.open_breakers,
        leader=running.leader,
        intake=running.intake,
        queues=await queue_depths(connection, names.watched_queues()),
    )


async def process_stats(store: StateStore, *, now: datetime) -> Processes:
    """The processes reporting (their heartbeats), their open circuit breakers and intake, and
    the supervisor leader: two reads, for `stats` and the console's processes."""
    lease = await store.lease_get(SUPERVISOR_LEASE)
    components = await store.list_status(now=now)
    leader = lease.holder if lease is not None and lease.expires_at > now else None
    breakers = sorted(
        {f"{c.name}: {op}" for c in components for op in c.data.get("open_breakers", [])}
    )
    return Processes(
        processes=processes(components, now),
        open_breakers=breakers,
        leader=leader,
        intake=intake_of(components),
    )


def processes(components: list[ComponentStatus], now: datetime) -> list[ProcessRow]:
    return [
        ProcessRow(name=c.name, kind=c.kind, seen=human_age(c.at, now), data=c.data)
        for c in components
    ]


def intake_of(components: list[ComponentStatus]) -> list[dict[str, Any]]:
    """Every consumer's intake as its process last reported it (the heartbeat's `intake`)."""
    return [
        {"process": c.name, **consumer}
        for c in components
        for consumer in c.data.get("intake") or []
        if isinstance(consumer, dict)
    ]
