"""The supervisor: one leader at a time recovers attempts whose deadline passed (DESIGN §4).

Leadership is the store's lease, renewed every interval; a dead leader's lease expires and a
standby, which tries again as the lease it saw runs out, takes it within one lease period. Each
sweep pages through expired Processing records and recovers each with a conditional update that
expects the `locked_by` and `complete_by` it saw, so a step restarted meanwhile, or a second
supervisor, makes the recovery match nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from datetime import timedelta
from typing import Any

from services.supervisor.gauges import LeaderGauges
from services.supervisor.retention import Retention
from shared.bootstrap import Runtime
from shared.domain.compensation import recover_compensation
from shared.domain.coordination import SUPERVISOR_LEASE
from shared.domain.journal import AlertKind, HistoryEventType, Severity
from shared.domain.models import StateRecord
from shared.domain.states import FAILED_STATES, LIVE_STATES, ProcessState
from shared.domain.timing import utcnow
from shared.domain.updates import recover
from shared.errors import ServiceUnavailable
from shared.metrics import RECOVERIES, SUPERVISOR_LEADER
from shared.policies import recovery_policy
from shared.store.port import ScanCursor
from shared.telemetry import log_fields
from shared.tracing import order_span

RECOVERED_TO = (
    ProcessState.PENDING,
    ProcessState.ERROR,
    ProcessState.COMPENSATING,
    ProcessState.COMPENSATION_FAILED,
)
"""Where a recovered attempt can take its order (`orderflow_supervisor_recoveries_total{to}`)."""

log = logging.getLogger(__name__)

EXPIRY_MARGIN_S = 0.02
"""A standby's next try comes this long after the lease it saw expires (clocks are
milliseconds)."""


class Supervisor:
    def __init__(self, runtime: Runtime) -> None:
        self._rt = runtime
        self._s = runtime.settings
        self._skew = timedelta(seconds=runtime.settings.process.clock_skew_s)
        self.name = runtime.name
        self.leader = False
        self.recoveries = 0
        self._report = runtime.reporter()
        self._policy = recovery_policy(self._s.supervisor, self._s.workflow)
        self._wait = self._s.supervisor.supervisor_interval_s
        """Until the next round: the interval, or less for a standby whose leader's lease
        expires sooner, so a dead leader is replaced as its lease runs out."""
        self._retention = Retention(
            runtime.store,
            runtime.settings.retention,
            clock_skew_s=runtime.settings.process.clock_skew_s,
        )
        """What the leader deletes once it expired (services/supervisor/retention.py)."""
        self._gauges = LeaderGauges(runtime.store, runtime.connection, runtime.names)
        SUPERVISOR_LEADER.set(0)
        for to in RECOVERED_TO:  # a series from the start: `increase` sees the first recovery
            RECOVERIES.labels(to.value)

    def status(self) -> dict[str, Any]:
        """This supervisor's part of its heartbeat."""
        return {"leader": self.leader, "retention": self._retention.counts.as_dict()}

    async def run(self, stop: asyncio.Event, *, burst: bool = False) -> None:
        """Rounds until `stop`; in `burst` mode, one round."""
        log.info("supervisor ready")
        try:
            while not stop.is_set():
                try:
                    if await self._hold_lease():
                        await self._sweep(stop)
                        await self._report_stuck()
                        await self._gauges.refresh()
                        await self._retention.run_due()
                except ServiceUnavailable as exc:
                    log.warning("a server is unavailable; retrying", extra={"error": str(exc)})
                except Exception:
                    log.exception("supervisor round failed")
                if burst:
                    return
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=self._wait)
                self._wait = self._s.supervisor.supervisor_interval_s
        finally:
            await self._gauges.clear()
            if self.leader:
                with contextlib.suppress(Exception):
                    await self._rt.store.lease_release(SUPERVISOR_LEASE, holder=self.name)

    async def _hold_lease(self) -> bool:
        now = utcnow()
        expires = now + timedelta(seconds=self._s.supervisor.lease_ttl_s)
        store = self._rt.store
        if self.leader:
            held = await store.lease_renew(
                SUPERVISOR_LEASE, holder=self.name, now=now, expires_at=expires
            )
            if not held:
                held = await store.lease_acquire(
                    SUPERVISOR_LEASE, holder=self.name, now=now - self._skew, expires_at=expires
                )
        else:
            # Whether the leader's lease ran out is judged by its clock, set by another host's:
            # allow for the skew, or a standby ahead of the leader would take it from a live one.
            held = await store.lease_acquire(
                SUPERVISOR_LEASE, holder=self.name, now=now - self._skew, expires_at=expires
            )
        if not held:
            await self._wait_for_expiry()
        if held != self.leader:
            log.info("leadership " + ("taken" if held else "lost"), extra={"supervisor": self.name})
            if not held:
                await self._gauges.clear()
        self.leader = held
        SUPERVISOR_LEADER.set(int(held))
        return held

    async def _wait_for_expiry(self) -> None:
        """A standby tries again when the current lease runs out, if that is before the next
        round: a leader that died just after renewing is replaced within one lease period."""
        lease = await self._rt.store.lease_get(SUPERVISOR_LEASE)
        if lease is not None:
            left = (lease.expires_at - utcnow()).total_seconds() + EXPIRY_MARGIN_S
            self._wait = max(EXPIRY_MARGIN_S, min(self._s.supervisor.supervisor_interval_s, left))

    async def _sweep(self, stop: asyncio.Event) -> None:
        cursor: ScanCursor | None = None
        while not stop.is_set():
            # A deadline is set by a scheduler's clock: only one past it by more than the
            # tolerated skew is surely expired (a supervisor ahead never recovers a live step).
            page = await self._rt.store.scan_expired(
                now=utcnow() - self._skew,
                states=LIVE_STATES,
                limit=self._s.supervisor.supervisor_scan_limit,
                after=cursor,
            )
            for record in page.records:
                await self._recover(record)
            cursor = page.next_cursor
            if cursor is None or not await self._hold_lease():
                return

    async def _recover(self, seen: StateRecord) -> None:
        with (
            log_fields(order_id=seen.order_id, instance_id=seen.locked_by),
            order_span(
                "recover",
                seen.order_id,
                attributes={
                    "orderflow.instance_id": seen.locked_by or "",
                    "orderflow.from": seen.process_state.value,
                },
            ),
        ):
            await self._recover_seen(seen)

    async def _recover_seen(self, seen: StateRecord) -> None:
        now = utcnow()
        compensating = seen.process_state is ProcessState.COMPENSATING
        update = (recover_compensation if compensating else recover)(
            seen, now=now, policy=self._policy
        )
        after = await self._rt.store.update_state(seen.order_id, update.expect, update.changes)
        if after is None:
            return  # the attempt moved on, or another supervisor got there first
        self.recoveries += 1
        RECOVERIES.labels(after.process_state.value).inc()
        attempt, instance_id = seen.attempt, seen.locked_by
        await self._report.history(
            seen.order_id,
            HistoryEventType.RECOVERED,
            attempt=attempt,
            instance_id=instance_id,
            failure_count=after.failure_count,
            to=after.process_state.value,
            expired=seen.complete_by.isoformat() if seen.complete_by else None,
        )
        log.info("recovered", extra={"order_id": seen.order_id, "to": after.process_state.value})
        if after.process_state in FAILED_STATES:
            await self._parked(seen, after)

    async def _parked(self, seen: StateRecord, after: StateRecord) -> None:
        """The failure threshold is reached: an operator must act."""
        message = after.error.message if after.error else "recovery limit reached"
        failed = after.process_state is ProcessState.COMPENSATION_FAILED
        await self._report.history(
            seen.order_id,
            HistoryEventType.COMPENSATION_FAILED if failed else HistoryEventType.ERROR_RAISED,
            attempt=seen.attempt,
            instance_id=seen.locked_by,
            kind="recovery-limit",
        )
        await self._report.alert(
            AlertKind.COMPENSATION_FAILED if failed else AlertKind.ORDER_ERROR,
            f"order {seen.order_id} in {after.process_state}: {message}",
            alert_id=f"parked:{seen.order_id}:{seen.attempt}",
            order_id=seen.order_id,
            error_kind="recovery-limit",
        )
        await self._report.failed(seen, after.process_state, message)

    async def _report_stuck(self) -> None:
        cutoff = utcnow() - timedelta(seconds=self._s.supervisor.stuck_pending_s)
        for record in await self._rt.store.find_stuck_pending(due_before=cutoff, limit=100):
            await self._report.alert(
                AlertKind.STUCK_PENDING,
                f"order {record.order_id} due since {record.next_attempt_at.isoformat()} and not "
                "claimed: is a scheduler running?",
                alert_id=f"stuck:{record.order_id}:{record.attempt}",
                order_id=record.order_id,
                severity=Severity.WARNING,
            )


async def serve_supervisor(runtime: Runtime, stop: asyncio.Event, *, burst: bool = False) -> None:
    supervisor = Supervisor(runtime)
    async with runtime.heartbeat("supervisor", supervisor.status):
        await supervisor.run(stop, burst=burst)
