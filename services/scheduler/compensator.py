"""Compensation: undo the steps of the compensation log, newest first (DESIGN §3-4).

Each undo has its own idempotency key, so repeating one (after a crash, or a second
compensation) never undoes twice. An undo the agent reports as failed makes the order
CompensationFailed with an alert at once. An undo with no reply by its deadline (the agent's
attempts went on transient failures, or something died) is left Compensating with its expired
deadline, like a forward step: the supervisor releases it for another attempt, and parks it in
CompensationFailed (with an alert) past the failure threshold. An operator can compensate a
CompensationFailed order again later; the undos already Done are skipped.

The attempt that failed compensates under its own fencing token, so a call of the failed step
that still hangs inside the remote service (the agent gave up on it) is not fenced off by the
undo: it may wake after the undo was recorded as a no-op. The remote service refuses that
call's effect, since an undo commutes with the call it undoes (decision:undo-commutes-with-call),
whoever
compensates and under whichever token.
"""

from __future__ import annotations

import logging

from services.scheduler.context import AttemptContext
from shared.domain.compensation import finish_compensation, record_undo, start_undo
from shared.domain.journal import AlertKind, CompensationEntry, UndoStatus
from shared.domain.journal import HistoryEventType as H
from shared.domain.messages import OrderStatus, StepAction, StepOutcome
from shared.domain.models import ErrorInfo, StateRecord
from shared.domain.states import ErrorKind, ProcessState
from shared.domain.timing import utcnow
from shared.domain.workflow import get_workflow
from shared.errors import Superseded
from shared.store.port import UndoMark
from shared.telemetry import bind_log_fields

log = logging.getLogger(__name__)


class _DeadlinePassed(Exception):
    """No reply to an undo by its deadline: the supervisor takes over."""


class Compensator:
    def __init__(self, ctx: AttemptContext) -> None:
        self._ctx = ctx

    async def run(self, record: StateRecord) -> None:
        """Compensate a Compensating record this attempt has locked."""
        instance_id = record.locked_by or ""
        bind_log_fields(order_id=record.order_id, instance_id=instance_id)
        try:
            await self._run(record, instance_id)
        except _DeadlinePassed as expired:
            await self._ctx.report.history(
                record.order_id,
                H.DEADLINE_EXPIRED,
                attempt=record.attempt,
                instance_id=instance_id,
                step=str(expired),
            )
        except Superseded:
            log.info(
                "compensation attempt superseded; stopping without a write",
                extra={"order_id": record.order_id, "instance_id": instance_id},
            )
            await self._ctx.report.history(
                record.order_id, H.LEASE_LOST, attempt=record.attempt, instance_id=instance_id
            )

    async def _run(self, record: StateRecord, instance_id: str) -> None:
        ctx = self._ctx
        await ctx.report.history(
            record.order_id, H.COMPENSATION_STARTED, attempt=record.attempt, instance_id=instance_id
        )
        log_entries = await ctx.store.read_compensation(record.order_id)
        current = record
        for entry in reversed(log_entries):
            if entry.status is UndoStatus.DONE:
                continue
            outcome = await self._undo(current, entry, instance_id)
            now = utcnow()
            if isinstance(outcome, ErrorInfo):
                failed = UndoMark(entry.step, UndoStatus.FAILED, now, outcome.message)
                await self._finish(current, instance_id, outcome, undo=failed)
                return
            # The step's Compensated status, the log's Done and the event: one fenced write.
            current = await ctx.write(
                record.order_id,
                record_undo(current, entry.step, instance=instance_id, now=now),
                history=[
                    ctx.report.event(
                        record.order_id,
                        H.COMPENSATION_STEP_DONE,
                        attempt=record.attempt,
                        instance_id=instance_id,
                        step=entry.step,
                        outcome=outcome,
                    )
                ],
                undo=UndoMark(entry.step, UndoStatus.DONE, now),
            )
        await self._finish(current, instance_id, None)

    async def _undo(
        self, record: StateRecord, entry: CompensationEntry, instance_id: str
    ) -> ErrorInfo | str | None:
        """Run one undo: the error that failed it, or the remote outcome when it is done."""
        ctx = self._ctx
        workflow = get_workflow(record.workflow, record.workflow_version)
        if workflow is None:
            return ErrorInfo(
                kind=ErrorKind.UNKNOWN_WORKFLOW,
                at=utcnow(),
                message=f"no workflow {record.workflow} v{record.workflow_version}",
            )
        step = workflow.step(entry.step)
        running = await ctx.write(
            record.order_id,
            start_undo(
                record,
                entry.step,
                instance=instance_id,
                now=utcnow(),
                timeout=ctx.rules.step_timeout,
            ),
        )
        assert running.complete_by is not None
        reply = await ctx.ask(
            step.agent,
            f"{instance_id}:{entry.step}:undo",
            renew=ctx.renewer(running, instance_id),
            order_id=record.order_id,
            step=entry.step,
            action=StepAction.UNDO,
            operation=entry.undo,
            fencing_token=instance_id,
            idempotency_key=entry.idempotency_key,
            complete_by=running.complete_by,
            attempts_allowed=ctx.rules.undo_attempts,
        )
        if reply is not None and reply.outcome is StepOutcome.OK:
            outcome = (reply.result or {}).get("outcome")
            return None if outcome is None else str(outcome)
        if reply is None or reply.error_kind is ErrorKind.TRANSIENT:
            # No answer, or only transient failures: the supervisor releases the compensation
            # after its deadline and another attempt tries again (up to the failure threshold).
            raise _DeadlinePassed(entry.step)
        reason = reply.error_message or "the agent reported a failure"
        return ErrorInfo(
            kind=ErrorKind.COMPENSATION,
            at=utcnow(),
            message=f"undo of {entry.step} ({entry.undo}) failed: {reason}",
        )

    async def _finish(
        self,
        record: StateRecord,
        instance_id: str,
        failure: ErrorInfo | None,
        *,
        undo: UndoMark | None = None,
    ) -> None:
        ctx = self._ctx
        after = await ctx.write(
            record.order_id,
            finish_compensation(record, instance=instance_id, now=utcnow(), failure=failure),
            undo=undo,
        )
        if after.process_state is ProcessState.COMPENSATED:
            await ctx.report.history(
                record.order_id,
                H.COMPENSATION_COMPLETED,
                attempt=record.attempt,
                instance_id=instance_id,
            )
            await ctx.report.status(
                record.order_id,
                record.reply_to,
                OrderStatus.COMPENSATED,
                after.process_state,
                message_id=f"{record.order_id}:status:compensated",
                detail=after.error.message if after.error is not None else None,
            )
            return
        assert failure is not None
        await ctx.report.history(
            record.order_id,
            H.COMPENSATION_FAILED,
            attempt=record.attempt,
            instance_id=instance_id,
            error=failure.message,
        )
        await ctx.report.alert(
            AlertKind.COMPENSATION_FAILED,
            f"order {record.order_id}: {failure.message}",
            alert_id=f"compensation-failed:{record.order_id}:{record.attempt}",
            order_id=record.order_id,
        )
        await ctx.report.failed(
            record, after.process_state, failure.message, why="compensation-failed"
        )
