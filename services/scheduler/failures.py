"""How an attempt ends a step that failed (DESIGN §4): given back at once after transient failures
(due again after the backoff, or parked at the failure threshold), moved to Compensating when the
workflow compensates the failure, or parked in Error with an alert and the Failed status. Every
write is fenced by the attempt's instance id, as the runner's (services/scheduler/runner.py).
"""

from __future__ import annotations

import logging

from services.scheduler.context import AttemptContext
from shared.domain import updates
from shared.domain.journal import AlertKind, HistoryEvent, Severity
from shared.domain.journal import HistoryEventType as H
from shared.domain.messages import StepReply
from shared.domain.models import ErrorInfo, StateRecord
from shared.domain.states import ErrorKind, ProcessState
from shared.domain.timing import utcnow
from shared.domain.updates import Update
from shared.domain.workflow import Workflow

# The attempt's lines, under the runner's name whichever part of it writes them.
log = logging.getLogger("services.scheduler.runner")


class Failures:
    def __init__(self, ctx: AttemptContext) -> None:
        self._ctx = ctx

    async def of_reply(
        self,
        running: StateRecord,
        workflow: Workflow,
        step: str,
        instance_id: str,
        reply: StepReply,
    ) -> StateRecord:
        """The agent reported a failure: give the order back when it was transient, else fail
        it as the workflow says."""
        error = ErrorInfo(
            kind=reply.error_kind or ErrorKind.PERMANENT,
            at=utcnow(),
            message=reply.error_message or "the agent reported a failure",
        )
        if error.kind is ErrorKind.TRANSIENT:
            return await self.release(
                running, step, instance_id, error, attempts_used=reply.attempts_used
            )
        return await self.fail(
            running, workflow, step, instance_id, error, attempts_used=reply.attempts_used
        )

    async def release(
        self,
        running: StateRecord,
        step: str,
        instance_id: str,
        error: ErrorInfo,
        *,
        attempts_used: int,
    ) -> StateRecord:
        """The agent spent its allowance on transient failures (or its circuit is open): give
        the order back at once, due again after the backoff (or parked at the threshold),
        rather than wait for the deadline."""
        ctx = self._ctx
        update = updates.release(
            running,
            step,
            instance=instance_id,
            now=utcnow(),
            error=error,
            attempts_used=attempts_used,
            policy=ctx.policy,
        )
        target = update.changes.fields["process_state"]
        parked = update.changes.fields.get("error") if target is ProcessState.ERROR else None
        events = self._released(running, step, instance_id, error, update, parked)
        after = await ctx.write(running.order_id, update, history=events)
        log.info(
            "step failed transiently; order given back",
            extra={"to": target.value, "error": error.message, "failures": after.failure_count},
        )
        if parked is not None:
            await self._parked(running, after, parked, step)
        return after

    def _released(
        self,
        running: StateRecord,
        step: str,
        instance_id: str,
        error: ErrorInfo,
        update: Update,
        parked: ErrorInfo | None,
    ) -> list[HistoryEvent]:
        """The events of a release: the step failed, the order recovered (or parked)."""
        ctx = self._ctx
        events = [
            ctx.event(
                running,
                H.STEP_FAILED,
                instance_id,
                step=step,
                error=error.message,
                kind=error.kind.value,
            ),
            ctx.event(
                running,
                H.RECOVERED,
                instance_id,
                to=update.changes.fields["process_state"].value,
                failure_count=update.changes.fields["failure_count"],
                reason="released by its attempt after transient failures",
            ),
        ]
        if parked is not None:
            events.append(ctx.event(running, H.ERROR_RAISED, instance_id, kind=parked.kind.value))
        return events

    async def fail(
        self,
        record: StateRecord,
        workflow: Workflow | None,
        step: str | None,
        instance_id: str,
        error: ErrorInfo,
        *,
        attempts_used: int = 0,
    ) -> StateRecord:
        """Park the order in Error (and alert), or move it to Compensating, per the workflow."""
        ctx = self._ctx
        compensate = workflow is not None and ctx.rules.compensates(workflow, error.kind)
        update = updates.fail(
            record,
            step or next(iter(record.steps)),
            instance=instance_id,
            now=utcnow(),
            error=error,
            attempts_used=attempts_used,
            compensate_within=ctx.rules.step_timeout if compensate else None,
        )
        events = [
            ctx.event(
                record,
                H.STEP_FAILED,
                instance_id,
                step=step,
                error=error.message,
                kind=error.kind.value,
            )
        ]
        if not compensate:
            events.append(ctx.event(record, H.ERROR_RAISED, instance_id, kind=error.kind.value))
        after = await ctx.write(record.order_id, update, history=events)
        log.info(
            "order failed",
            extra={
                "to": after.process_state.value,
                "kind": error.kind.value,
                "error": error.message,
            },
        )
        if not compensate:
            await self._parked(record, after, error, step)
        elif error.kind is ErrorKind.BUDGET_EXHAUSTED:
            await self._budget_spent(record, error, step)
        return after

    async def _parked(
        self, record: StateRecord, after: StateRecord, error: ErrorInfo, step: str | None
    ) -> None:
        """An order this attempt parked in Error: the alert, and the Failed status message."""
        ctx = self._ctx
        await ctx.report.alert(
            AlertKind.ORDER_ERROR,
            f"order {record.order_id} in Error ({error.kind}): {error.message}",
            alert_id=f"order-error:{record.order_id}:{record.attempt}",
            order_id=record.order_id,
            error_kind=error.kind.value,
            step=step,
        )
        await ctx.report.failed(record, after.process_state, error.message)

    async def _budget_spent(self, record: StateRecord, error: ErrorInfo, step: str | None) -> None:
        """The order is compensated, not parked, but a spent budget is still news for an
        operator: the remote service may be failing every call."""
        await self._ctx.report.alert(
            AlertKind.BUDGET_EXHAUSTED,
            f"order {record.order_id} compensated: {error.message}",
            alert_id=f"budget:{record.order_id}:{record.attempt}",
            order_id=record.order_id,
            error_kind=error.kind.value,
            step=step,
            severity=Severity.WARNING,
        )
