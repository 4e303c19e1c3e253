"""Coordination on MongoDB: the leader lease, alerts, component statuses (`Leases`, `Alerts`,
`ComponentStatuses`)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from pymongo import ASCENDING, DESCENDING
from pymongo.errors import DuplicateKeyError

from shared.domain.coordination import ComponentStatus, Lease
from shared.domain.journal import Alert, AlertAction, AlertState
from shared.store.codec import plain
from shared.store.mongo.connection import MongoPart, load
from shared.store.values import AlertCursor


class MongoCoordination(MongoPart):
    async def lease_acquire(
        self, name: str, *, holder: str, now: datetime, expires_at: datetime
    ) -> bool:
        if await self.lease_renew(name, holder=holder, now=now, expires_at=expires_at):
            return True
        try:
            # Upsert over a free or expired lease; over a live one held by another the filter
            # matches nothing, the upsert collides on _id, and the lease stays theirs.
            await self._lease.update_one(
                {"_id": name, "$or": [{"expires_at": {"$lte": now}}, {"holder": holder}]},
                {
                    "$set": {
                        "name": name,
                        "holder": holder,
                        "expires_at": expires_at,
                        "acquired_at": now,
                    }
                },
                upsert=True,
            )
        except DuplicateKeyError:
            return False
        return True

    async def lease_renew(
        self, name: str, *, holder: str, now: datetime, expires_at: datetime
    ) -> bool:
        result = await self._lease.update_one(
            {"_id": name, "holder": holder, "expires_at": {"$gt": now}},
            {"$set": {"expires_at": expires_at}},
        )
        return bool(result.matched_count == 1)

    async def lease_release(self, name: str, *, holder: str) -> bool:
        result = await self._lease.delete_one({"_id": name, "holder": holder})
        return bool(result.deleted_count == 1)

    async def lease_get(self, name: str) -> Lease | None:
        doc = await self._lease.find_one({"_id": name})
        return None if doc is None else load(Lease, doc)

    async def raise_alert(self, alert: Alert) -> bool:
        doc = plain(alert)
        doc["_id"] = alert.alert_id
        try:
            await self._alerts.insert_one(doc)
        except DuplicateKeyError:
            return False
        return True

    async def list_alerts(
        self, *, since: datetime | None = None, limit: int = 100, after: AlertCursor | None = None
    ) -> list[Alert]:
        window: dict[str, Any] = {}
        if since is not None:
            window["$gte"] = since
        if after is not None:  # `$lte` bounds the scan of `alerts_by_time`; `$or` skips the read
            window["$lte"] = after.at
        query: dict[str, Any] = {"at": window} if window else {}
        if after is not None:
            query["$or"] = [
                {"at": {"$lt": after.at}},
                {"at": after.at, "_id": {"$gt": after.alert_id}},
            ]
        cursor = self._alerts.find(query).sort([("at", DESCENDING), ("_id", ASCENDING)])
        return [_alert(d) for d in await cursor.limit(limit).to_list(None)]

    async def mark_alert(
        self, alert_id: str, action: AlertAction, *, by: str, at: datetime
    ) -> AlertState | None:
        # The first record stands: set only where none is (a missing field matches None).
        field = "acknowledged" if action is AlertAction.ACKNOWLEDGE else "resolved"
        await self._alerts.update_one(
            {"_id": alert_id, f"state.{field}_at": None},
            {
                "$set": {f"state.{field}_at": at, f"state.{field}_by": by},
                "$max": {"state.changed_at": at},
            },
        )
        doc = await self._alerts.find_one({"_id": alert_id}, {"state": 1})
        return None if doc is None else _state(alert_id, doc)

    async def alert_states(self, alert_ids: Sequence[str]) -> dict[str, AlertState]:
        cursor = self._alerts.find({"_id": {"$in": list(alert_ids)}}, {"state": 1})
        return {d["_id"]: _state(d["_id"], d) for d in await cursor.to_list(None)}

    async def changed_alerts(
        self, *, since: datetime, limit: int, after: str | None = None
    ) -> list[tuple[Alert, AlertState]]:
        query = {
            "$or": [
                {"state.changed_at": {"$gt": since}},
                {"state.changed_at": since, "_id": {"$gt": after or ""}},
            ]
        }
        cursor = self._alerts.find(query).sort(
            [("state.changed_at", ASCENDING), ("_id", ASCENDING)]
        )
        return [(_alert(d), _state(d["_id"], d)) for d in await cursor.limit(limit).to_list(None)]

    async def report_status(self, status: ComponentStatus) -> None:
        doc = plain(status)
        doc["_id"] = status.name
        await self._components.replace_one({"_id": status.name}, doc, upsert=True)

    async def list_status(self, *, now: datetime) -> list[ComponentStatus]:
        cursor = self._components.find({"expires_at": {"$gt": now}}).sort(
            [("kind", ASCENDING), ("_id", ASCENDING)]
        )
        return [load(ComponentStatus, d) for d in await cursor.to_list(None)]

    async def forget_status(self, name: str) -> None:
        await self._components.delete_one({"_id": name})


def _alert(doc: dict[str, Any]) -> Alert:
    alert: Alert = load(Alert, {k: v for k, v in doc.items() if k != "state"})
    return alert


def _state(alert_id: str, doc: dict[str, Any]) -> AlertState:
    fields = dict(doc.get("state") or {})
    fields.pop("changed_at", None)  # kept for `changed_alerts` to sort and select by
    state: AlertState = load(AlertState, fields, alert_id=alert_id)
    return state
