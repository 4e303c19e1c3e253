"""Coordination in memory: the leader lease, alerts, component statuses (`Leases`, `Alerts`,
`ComponentStatuses`)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from shared.domain.coordination import ComponentStatus, Lease
from shared.domain.journal import Alert, AlertAction, AlertState
from shared.store.memory.tables import MemoryPart
from shared.store.values import AlertCursor


class MemoryCoordination(MemoryPart):
    async def lease_acquire(
        self, name: str, *, holder: str, now: datetime, expires_at: datetime
    ) -> bool:
        lease = self._leases.get(name)
        if lease is not None and lease.holder == holder and lease.expires_at > now:
            self._leases[name] = lease.model_copy(update={"expires_at": expires_at})
            return True
        if lease is not None and lease.holder != holder and lease.expires_at > now:
            return False
        self._leases[name] = Lease(name=name, holder=holder, expires_at=expires_at, acquired_at=now)
        return True

    async def lease_renew(
        self, name: str, *, holder: str, now: datetime, expires_at: datetime
    ) -> bool:
        lease = self._leases.get(name)
        if lease is None or lease.holder != holder or lease.expires_at <= now:
            return False
        self._leases[name] = lease.model_copy(update={"expires_at": expires_at})
        return True

    async def lease_release(self, name: str, *, holder: str) -> bool:
        lease = self._leases.get(name)
        if lease is None or lease.holder != holder:
            return False
        del self._leases[name]
        return True

    async def lease_get(self, name: str) -> Lease | None:
        return self._leases.get(name)

    async def raise_alert(self, alert: Alert) -> bool:
        if alert.alert_id in self._alerts:
            return False
        self._alerts[alert.alert_id] = alert
        return True

    async def list_alerts(
        self, *, since: datetime | None = None, limit: int = 100, after: AlertCursor | None = None
    ) -> list[Alert]:
        found = [
            a
            for a in self._alerts.values()
            if (since is None or a.at >= since)
            and (
                after is None
                or a.at < after.at
                or (a.at == after.at and a.alert_id > after.alert_id)
            )
        ]
        found.sort(key=lambda a: a.alert_id)
        found.sort(key=lambda a: a.at, reverse=True)
        return found[:limit]

    async def mark_alert(
        self, alert_id: str, action: AlertAction, *, by: str, at: datetime
    ) -> AlertState | None:
        if alert_id not in self._alerts:
            return None
        state = self._alert_states.get(alert_id) or AlertState(alert_id=alert_id)
        self._alert_states[alert_id] = state = state.with_action(action, by=by, at=at)
        return state

    async def alert_states(self, alert_ids: Sequence[str]) -> dict[str, AlertState]:
        return {
            i: self._alert_states.get(i) or AlertState(alert_id=i)
            for i in alert_ids
            if i in self._alerts
        }

    async def changed_alerts(
        self, *, since: datetime, limit: int, after: str | None = None
    ) -> list[tuple[Alert, AlertState]]:
        changed = [
            (changed_at, self._alerts[s.alert_id], s)
            for s in self._alert_states.values()
            if (changed_at := s.changed_at) is not None
            and (changed_at > since or (changed_at == since and s.alert_id > (after or "")))
        ]
        changed.sort(key=lambda c: (c[0], c[1].alert_id))
        return [(alert, state) for _, alert, state in changed[:limit]]

    async def report_status(self, status: ComponentStatus) -> None:
        self._components[status.name] = status

    async def list_status(self, *, now: datetime) -> list[ComponentStatus]:
        live = [s for s in self._components.values() if s.expires_at > now]
        return sorted(live, key=lambda s: (s.kind, s.name))

    async def forget_status(self, name: str) -> None:
        self._components.pop(name, None)
