"""The scheduler watches for a missing supervisor leader (the `no-leader` alert).

A supervisor cannot report its own absence, so another process must. The schedulers do: they
always run while orders are processed, their attempts are the ones left stranded when no
supervisor recovers expired steps, and watching from one kind of process keeps the number of
watchers (and of duplicate alerts) small. Agents and submission need no leader to do their work.

A leaderless period starts when the last lease expired (known to every watcher alike, so all
of them name the period the same and the store keeps one alert), or, when there is no lease at
all (never taken, or released by a supervisor that stopped cleanly), when this watcher first saw
none; then a `no-leader` alert already raised since then by another watcher is enough.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from shared.domain.coordination import SUPERVISOR_LEASE, Lease
from shared.domain.journal import AlertKind
from shared.domain.timing import utcnow
from shared.reporting import Reporter
from shared.store.port import StateStore


class LeaderWatch:
    def __init__(self, store: StateStore, report: Reporter, *, after: timedelta) -> None:
        self._store = store
        self._report = report
        self._after = after
        self._first_seen_without: datetime | None = None
        self._alerted: str | None = None

    def leaderless_since(self, lease: Lease | None, *, now: datetime) -> datetime | None:
        """When the current leaderless period started; None while a supervisor leads."""
        if lease is not None:
            self._first_seen_without = None
            return None if lease.expires_at > now else lease.expires_at
        if self._first_seen_without is None:
            self._first_seen_without = now
        return self._first_seen_without

    async def check(self, now: datetime | None = None) -> None:
        now = now or utcnow()
        lease = await self._store.lease_get(SUPERVISOR_LEASE)
        since = self.leaderless_since(lease, now=now)
        if since is None or now - since <= self._after:
            return
        alert_id = f"no-leader:{since.isoformat(timespec='milliseconds')}"
        if alert_id == self._alerted:
            return
        if lease is None and await self._raised_since(since):
            self._alerted = alert_id  # another watcher reported this period
            return
        last = f" (the last leader was {lease.holder})" if lease is not None else ""
        await self._report.alert(
            AlertKind.NO_LEADER,
            f"no supervisor has held the leader lease since {since.isoformat()}{last}: expired "
            "steps are not recovered. Is a supervisor running?",
            alert_id=alert_id,
            since=since.isoformat(),
            last_leader=lease.holder if lease is not None else None,
        )
        self._alerted = alert_id

    async def _raised_since(self, since: datetime) -> bool:
        alerts = await self._store.list_alerts(since=since, limit=100)
        return any(a.kind is AlertKind.NO_LEADER for a in alerts)
