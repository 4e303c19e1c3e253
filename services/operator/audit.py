"""`orderflow audit` of a hub: its store, the remote service's ledger and attempts, and its
dead-letter queues, read and checked against DESIGN §8 (the checks: `invariants.py`)."""

from __future__ import annotations

from datetime import timedelta

from services.operator.invariants import AuditReport, audit, check_dead_letters
from services.operator.operations import open_operations
from shared.config import Settings
from shared.domain.timing import utcnow
from shared.remote.admin import admin_token
from shared.remote.client import RemoteClient


async def audit_hub(settings: Settings, grace: float) -> AuditReport:
    """The audit of the settings' hub: `grace` seconds a live attempt may be past its deadline
    before it counts as lost."""
    client = RemoteClient.open(settings.remote.remote_url, admin_token=admin_token())
    try:
        effects = await client.ledger(account=settings.hub)  # this hub's effects only
        attempts = await client.attempts(account=settings.hub)
    finally:
        await client.close()
    async with open_operations(settings, name="orderflow-audit", broker=True) as ops:
        report = await audit(
            ops.store,
            effects,
            now=utcnow(),
            grace=timedelta(seconds=grace),
            attempts=attempts,
            undo_attempts=settings.workflow.undo_attempts,
        )
        letters = await ops.dead_letters(None)
        check_dead_letters(report, [letter.model_dump() for letter in letters])
    return report
