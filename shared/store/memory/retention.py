"""Retention in memory: bounded purges of what expired, and the tables' sizes (`Purges`)."""

from __future__ import annotations

from collections.abc import Sized
from datetime import datetime

from shared.domain.states import TERMINAL_STATES
from shared.store.memory.tables import TABLES, MemoryPart, oldest
from shared.store.values import Purged


class MemoryRetention(MemoryPart):
    def _finished_before(self, order_id: str, cutoff: datetime) -> bool:
        record = self._states.get(order_id)
        return (
            record is not None
            and record.process_state in TERMINAL_STATES
            and record.updated_at < cutoff
        )

    async def purge_journal(self, *, finished_before: datetime, limit: int) -> Purged:
        history = [
            (e.at, n)
            for n, e in self._history.items()
            if e.at < finished_before and self._finished_before(e.order_id, finished_before)
        ]
        for _, n in sorted(history)[:limit]:
            del self._history[n]
        undos = [
            (e.recorded_at, e.seq or 0, key)
            for key, e in self._compensation.items()
            if e.recorded_at < finished_before
            and self._finished_before(e.order_id, finished_before)
        ]
        for *_, key in sorted(undos)[:limit]:
            del self._compensation[key]
        return Purged(history=min(len(history), limit), compensation=min(len(undos), limit))

    async def purge_orders(self, *, finished_before: datetime, limit: int) -> Purged:
        finished = [
            r for r in self._states.values() if self._finished_before(r.order_id, finished_before)
        ]
        ids = {r.order_id for r in oldest(finished, lambda r: (r.updated_at, r.order_id), limit)}
        history = [n for n, e in self._history.items() if e.order_id in ids]
        undos = [key for key in self._compensation if key[0] in ids]
        for n in history:
            del self._history[n]
        for key in undos:
            del self._compensation[key]
        for order_id in ids:
            self._orders.pop(order_id, None)
            del self._states[order_id]
        return Purged(len(ids), len(history), len(undos))

    async def purge_alerts(self, *, raised_before: datetime, limit: int) -> int:
        old = [a for a in self._alerts.values() if a.at < raised_before]
        for alert in oldest(old, lambda a: (a.at, a.alert_id), limit):
            del self._alerts[alert.alert_id]
            self._alert_states.pop(alert.alert_id, None)
        return min(len(old), limit)

    async def record_counts(self) -> dict[str, int]:
        sizes: dict[str, Sized] = {
            "alerts": self._alerts,
            "api_tokens": self._tokens,
            "compensation_log": self._compensation,
            "components": self._components,
            "history": self._history,
            "inbox": self._inbox,
            "lease": self._leases,
            "orders": self._orders,
            "state": self._states,
        }
        return {name: len(sizes[name]) for name in TABLES}

    async def inbox_purge(self, *, now: datetime, limit: int) -> int:
        expired = [(e.expires_at, k) for k, e in self._inbox.items() if e.expires_at <= now]
        for _, key in sorted(expired)[:limit]:
            del self._inbox[key]
        return min(len(expired), limit)
