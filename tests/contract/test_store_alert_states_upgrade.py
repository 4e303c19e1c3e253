"""An existing PostgreSQL hub gets the alerts' acknowledgement and resolution columns from
`orderflow init` (the store's idempotent `init`), its alerts kept (issue 19)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from shared.domain.journal import Alert, AlertAction, AlertKind, Severity
from shared.domain.timing import utcnow
from shared.store.postgres import PostgresStore
from tests.conftest import POSTGRES_URL, service_missing

pytestmark = pytest.mark.postgres


@pytest.fixture
async def store(hub: str) -> AsyncIterator[PostgresStore]:
    try:
        opened = await PostgresStore.connect(
            POSTGRES_URL, hub, pool_size=2, timeout=5, command_timeout=10
        )
    except Exception as exc:
        service_missing("PostgreSQL", exc)
    try:
        await opened.init()
        yield opened
    finally:
        await opened.drop()
        await opened.close()


async def test_init_adds_the_alert_state_columns_to_an_older_hub(
    store: PostgresStore, hub: str
) -> None:
    alert = Alert(
        alert_id="old-1",
        kind=AlertKind.NO_LEADER,
        severity=Severity.CRITICAL,
        message="raised by an older release",
        at=utcnow(),
    )
    await store.raise_alert(alert)
    # The table as an older release made it.
    await store._pool.execute(f'DROP INDEX "{hub}".alerts_changed')
    for column in ("acknowledged_at", "acknowledged_by", "resolved_at", "resolved_by"):
        await store._pool.execute(f'ALTER TABLE "{hub}".alerts DROP COLUMN {column}')
    with pytest.raises(Exception, match="acknowledged"):
        await store.mark_alert("old-1", AlertAction.ACKNOWLEDGE, by="ann", at=utcnow())

    await store.init()
    assert await store.list_alerts() == [alert]
    state = await store.mark_alert("old-1", AlertAction.ACKNOWLEDGE, by="ann", at=utcnow())
    assert state is not None and state.acknowledged_by == "ann"
    await store.init()  # again: nothing changes
    assert (await store.alert_states(["old-1"]))["old-1"] == state
