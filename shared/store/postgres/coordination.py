"""Coordination on PostgreSQL: the leader lease, alerts, component statuses (`Leases`,
`Alerts`, `ComponentStatuses`)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

import asyncpg

from shared.domain.coordination import ComponentStatus, Lease
from shared.domain.journal import Alert, AlertAction, AlertState
from shared.domain.models import STORED
from shared.store.codec import jsonable
from shared.store.postgres.connection import PostgresPart, affected, read_row
from shared.store.values import AlertCursor

ALERT_COLUMNS = "alert_id, kind, severity, message, at, order_id, source, data, schema_version"
STATE_COLUMNS = "acknowledged_at, acknowledged_by, resolved_at, resolved_by"
CHANGED_AT = "GREATEST(acknowledged_at, resolved_at)"
"""When an alert was last acknowledged or resolved (GREATEST ignores NULLs; as the index
`alerts_changed` has it)."""

STATUS_KEPT = timedelta(hours=1)
"""Expired statuses are pruned after this (a listing ignores them at once)."""


class PostgresCoordination(PostgresPart):
    async def lease_acquire(
        self, name: str, *, holder: str, now: datetime, expires_at: datetime
    ) -> bool:
        got = await self._pool.fetchval(
            f"""
            INSERT INTO {self._s}.lease AS l VALUES ($1, $2, $3, $4)
            ON CONFLICT (name) DO UPDATE
               SET holder = EXCLUDED.holder, expires_at = EXCLUDED.expires_at,
                   acquired_at = CASE WHEN l.holder = EXCLUDED.holder AND l.expires_at > $4
                                      THEN l.acquired_at ELSE EXCLUDED.acquired_at END
             WHERE l.holder = EXCLUDED.holder OR l.expires_at <= $4
            RETURNING true
            """,
            name,
            holder,
            expires_at,
            now,
        )
        return bool(got)

    async def lease_renew(
        self, name: str, *, holder: str, now: datetime, expires_at: datetime
    ) -> bool:
        result = await self._pool.execute(
            f"UPDATE {self._s}.lease SET expires_at = $3 "
            "WHERE name = $1 AND holder = $2 AND expires_at > $4",
            name,
            holder,
            expires_at,
            now,
        )
        return affected(result) == 1

    async def lease_release(self, name: str, *, holder: str) -> bool:
        result = await self._pool.execute(
            f"DELETE FROM {self._s}.lease WHERE name = $1 AND holder = $2", name, holder
        )
        return affected(result) == 1

    async def lease_get(self, name: str) -> Lease | None:
        row = await self._pool.fetchrow(f"SELECT * FROM {self._s}.lease WHERE name = $1", name)
        return None if row is None else read_row(Lease, row)

    async def raise_alert(self, alert: Alert) -> bool:
        created = await self._pool.fetchval(
            f"INSERT INTO {self._s}.alerts (alert_id, kind, severity, message, at, order_id, "
            "source, data, schema_version) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) "
            "ON CONFLICT (alert_id) DO NOTHING RETURNING true",
            alert.alert_id,
            alert.kind.value,
            alert.severity.value,
            alert.message,
            alert.at,
            alert.order_id,
            alert.source,
            jsonable(alert.data),
            alert.schema_version,
        )
        return bool(created)

    async def list_alerts(
        self, *, since: datetime | None = None, limit: int = 100, after: AlertCursor | None = None
    ) -> list[Alert]:
        # `at <= $3` alone bounds the scan of `alerts_by_time`; the rest skips what was read.
        rows = await self._pool.fetch(
            f"SELECT {ALERT_COLUMNS} FROM {self._s}.alerts "
            "WHERE ($1::timestamptz IS NULL OR at >= $1) "
            "AND ($3::timestamptz IS NULL OR (at <= $3 AND (at < $3 OR alert_id > $4))) "
            "ORDER BY at DESC, alert_id LIMIT $2",
            since,
            limit,
            None if after is None else after.at,
            "" if after is None else after.alert_id,
        )
        return [read_row(Alert, r) for r in rows]

    async def mark_alert(
        self, alert_id: str, action: AlertAction, *, by: str, at: datetime
    ) -> AlertState | None:
        field = "acknowledged" if action is AlertAction.ACKNOWLEDGE else "resolved"
        # The first record stands: COALESCE keeps a time (and its author) already there.
        row = await self._pool.fetchrow(
            f"UPDATE {self._s}.alerts SET {field}_by = CASE WHEN {field}_at IS NULL THEN $2 "
            f"ELSE {field}_by END, {field}_at = COALESCE({field}_at, $3) WHERE alert_id = $1 "
            f"RETURNING alert_id, {STATE_COLUMNS}",
            alert_id,
            by,
            at,
        )
        return None if row is None else read_row(AlertState, row)

    async def alert_states(self, alert_ids: Sequence[str]) -> dict[str, AlertState]:
        rows = await self._pool.fetch(
            f"SELECT alert_id, {STATE_COLUMNS} FROM {self._s}.alerts "
            "WHERE alert_id = ANY($1::text[])",
            list(alert_ids),
        )
        return {r["alert_id"]: read_row(AlertState, r) for r in rows}

    async def changed_alerts(
        self, *, since: datetime, limit: int, after: str | None = None
    ) -> list[tuple[Alert, AlertState]]:
        # `alert_id > ''` holds for every id (none is empty): no `after`, every change at `since`.
        rows = await self._pool.fetch(
            f"SELECT {ALERT_COLUMNS}, {STATE_COLUMNS} FROM {self._s}.alerts "
            "WHERE (acknowledged_at IS NOT NULL OR resolved_at IS NOT NULL) "
            f"AND {CHANGED_AT} >= $1 AND ({CHANGED_AT} > $1 OR alert_id > $3) "
            f"ORDER BY {CHANGED_AT}, alert_id LIMIT $2",
            since,
            limit,
            after or "",
        )
        return [_split(r) for r in rows]

    async def report_status(self, status: ComponentStatus) -> None:
        await self._pool.execute(
            f"INSERT INTO {self._s}.components VALUES ($1, $2, $3, $4, $5) "
            "ON CONFLICT (name) DO UPDATE SET kind = EXCLUDED.kind, at = EXCLUDED.at, "
            "expires_at = EXCLUDED.expires_at, data = EXCLUDED.data",
            status.name,
            status.kind,
            status.at,
            status.expires_at,
            jsonable(status.data),
        )

    async def list_status(self, *, now: datetime) -> list[ComponentStatus]:
        await self._pool.execute(
            f"DELETE FROM {self._s}.components WHERE expires_at < $1", now - STATUS_KEPT
        )
        rows = await self._pool.fetch(
            f"SELECT * FROM {self._s}.components WHERE expires_at > $1 ORDER BY kind, name", now
        )
        return [read_row(ComponentStatus, r) for r in rows]

    async def forget_status(self, name: str) -> None:
        await self._pool.execute(f"DELETE FROM {self._s}.components WHERE name = $1", name)


def _split(row: asyncpg.Record) -> tuple[Alert, AlertState]:
    """An alerts row as the alert and its state."""
    doc = dict(row)
    state = {k: doc.pop(k) for k in STATE_COLUMNS.split(", ")}
    alert = Alert.model_validate(doc, strict=False, context=STORED)
    return alert, AlertState.model_validate(
        state | {"alert_id": alert.alert_id}, strict=False, context=STORED
    )
