"""Running one claimed attempt of an order's workflow, step by step (DESIGN §4).

Every write is fenced by the attempt's instance id; when a write matches nothing the attempt was
superseded and stops touching anything. When a step's deadline passes first, the attempt stops
waiting and leaves the record Processing for the supervisor.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from shared.broker.private import ReplyRouter
from shared.broker.publisher import Publisher
from shared.broker.topology import Names
from shared.config import Settings
from shared.domain.journal import AlertKind, CompensationEntry
from shared.domain.journal import HistoryEventType as H
from shared.domain.messages import OrderStatus, StepAction, StepOutcome, StepReply, StepRequest
from shared.domain.models import ErrorInfo, OrderRecord, StateRecord
from shared.domain.states import ErrorKind, ProcessState, StepStatus
from shared.domain.timing import utcnow
from shared.domain.updates import complete_step, fail, start_step
from shared.domain.workflow import StepDefinition, Workflow, get_workflow, idempotency_key
from shared.errors import PublishError
from shared.reporting import Reporter
from shared.store.port import StateStore

log = logging.getLogger(__name__)


class Superseded(Exception):
    """A fenced write matched nothing: another attempt owns the order now."""


class OrderRunner:
    def __init__(
        self,
        *,
        store: StateStore,
        publisher: Publisher,
        names: Names,
        router: ReplyRouter,
        reply_queue: str,
        reporter: Reporter,
        settings: Settings,
    ) -> None:
        self._store = store
        self._publisher = publisher
        self._names = names
        self._router = router
        self._reply_queue = reply_queue
        self._report = reporter
        self._settings = settings

    async def run(self, record: StateRecord) -> None:
        instance = record.locked_by or ""
        ctx = {"order_id": record.order_id, "instance_id": instance}
        await self._report.history(
            record.order_id, H.EXECUTION_STARTED, attempt=record.attempt, instance_id=instance
        )
        try:
            await self._run(record, instance)
        except Superseded:
            log.info("attempt superseded; stopping without a write", extra=ctx)
            await self._report.history(
                record.order_id, H.LEASE_LOST, attempt=record.attempt, instance_id=instance
            )

    async def _run(self, record: StateRecord, instance: str) -> None:
        workflow = get_workflow(record.workflow, record.workflow_version)
        order = await self._store.get_order(record.order_id)
        if workflow is None or order is None:
            missing = "order record" if order is None else "workflow"
            await self._fail(
                record,
                None,
                instance,
                ErrorInfo(
                    kind=ErrorKind.UNKNOWN_WORKFLOW if workflow is None else ErrorKind.PERMANENT,
                    message=f"no {missing} for {record.workflow} v{record.workflow_version}",
                    at=utcnow(),
                ),
            )
            return
        if record.attempt == 1:
            await self._report.status(
                record.order_id,
                record.reply_to,
                OrderStatus.PROCESSING,
                record.process_state,
                message_id=f"{record.order_id}:status:processing",
            )
        current: StateRecord | None = record
        for step in workflow.steps:
            if current is None:
                return
            if current.steps[step.name].status is StepStatus.COMPLETED:
                continue  # a checkpoint: never run again
            current = await self._run_step(current, order, workflow, step, instance)

    async def _run_step(
        self,
        record: StateRecord,
        order: OrderRecord,
        workflow: Workflow,
        step: StepDefinition,
        instance: str,
    ) -> StateRecord | None:
        budget = record.retry_budget
        if budget.remaining < 1:
            error = ErrorInfo(
                kind=ErrorKind.BUDGET_EXHAUSTED,
                at=utcnow(),
                message=f"retry budget of {budget.limit} attempts spent",
            )
            await self._fail(record, step.name, instance, error)
            return None
        allowance = min(self._settings.agent_attempts_per_request, budget.remaining)
        update = start_step(
            record,
            step.name,
            instance=instance,
            now=utcnow(),
            timeout=self._settings.step_timeout,
            allowance=allowance,
        )
        running = await self._write(record.order_id, update)
        complete_by = running.complete_by
        assert complete_by is not None
        # The undo is logged before the effect can exist, so a crash can never leave an effect
        # without its undo on record (an undo of an effect never made is a no-op remotely).
        await self._store.append_compensation(
            CompensationEntry(
                order_id=order.order_id,
                step=step.name,
                undo=step.undo,
                recorded_at=utcnow(),
                idempotency_key=idempotency_key(order.order_id, step.name, undo=True),
            )
        )
        attempts = running.steps[step.name].attempts
        await self._report.history(
            record.order_id,
            H.STEP_SCHEDULED,
            attempt=record.attempt,
            instance_id=instance,
            step=step.name,
            complete_by=complete_by.isoformat(),
            allowance=allowance,
        )
        reply = await self._ask(order, step, instance, attempts, running)
        if reply is None:
            await self._report.history(
                record.order_id,
                H.DEADLINE_EXPIRED,
                attempt=record.attempt,
                instance_id=instance,
                step=step.name,
            )
            return None
        if reply.outcome is StepOutcome.OK:
            return await self._complete(running, workflow, step, instance, reply)
        error = ErrorInfo(
            kind=reply.error_kind or ErrorKind.PERMANENT,
            at=utcnow(),
            message=reply.error_message or "the agent reported a failure",
        )
        await self._fail(running, step.name, instance, error, attempts_used=reply.attempts_used)
        return None

    async def _ask(
        self,
        order: OrderRecord,
        step: StepDefinition,
        instance: str,
        attempts: int,
        running: StateRecord,
    ) -> StepReply | None:
        """Send the request and race its reply against the deadline; None if the deadline won."""
        assert running.complete_by is not None
        message_id = f"{instance}:{step.name}:{attempts}"
        request = StepRequest(
            order_id=order.order_id,
            step=step.name,
            action=StepAction.DO,
            operation=step.operation,
            fencing_token=instance,
            idempotency_key=idempotency_key(order.order_id, step.name),
            complete_by=running.complete_by,
            attempts_allowed=running.steps[step.name].allowance,
            payload=_payload(order, step),
            reply_to=self._reply_queue,
        )
        waiting = self._router.expect(message_id)
        try:
            await self._publisher.publish(
                request,
                exchange=self._names.exchange,
                routing_key=self._names.agent(step.agent),
                message_id=message_id,
                correlation_id=message_id,
            )
            left = (running.complete_by - utcnow()).total_seconds()
            reply = await asyncio.wait_for(waiting, timeout=max(0.0, left))
        except TimeoutError:
            return None
        except PublishError:
            log.exception(
                "could not send a step request; the supervisor will recover it",
                extra={"order_id": order.order_id, "step": step.name},
            )
            return None
        finally:
            self._router.forget(message_id)
        assert isinstance(reply, StepReply)
        return reply

    async def _complete(
        self,
        running: StateRecord,
        workflow: Workflow,
        step: StepDefinition,
        instance: str,
        reply: StepReply,
    ) -> StateRecord | None:
        update = complete_step(
            running,
            workflow,
            step.name,
            instance=instance,
            now=utcnow(),
            result=reply.result or {},
            attempts_used=reply.attempts_used,
        )
        after = await self._write(running.order_id, update)
        await self._report.history(
            running.order_id,
            H.STEP_COMPLETED,
            attempt=running.attempt,
            instance_id=instance,
            step=step.name,
            attempts_used=reply.attempts_used,
        )
        if after.process_state is not ProcessState.PROCESSED:
            return after
        await self._report.history(
            running.order_id, H.EXECUTION_COMPLETED, attempt=running.attempt, instance_id=instance
        )
        await self._report.status(
            running.order_id,
            running.reply_to,
            OrderStatus.COMPLETED,
            after.process_state,
            message_id=f"{running.order_id}:status:completed",
        )
        return None

    async def _fail(
        self,
        record: StateRecord,
        step: str | None,
        instance: str,
        error: ErrorInfo,
        *,
        attempts_used: int = 0,
    ) -> None:
        target_step = step or next(iter(record.steps))
        update = fail(
            record,
            target_step,
            instance=instance,
            now=utcnow(),
            error=error,
            attempts_used=attempts_used,
            compensate=False,
        )
        after = await self._write(record.order_id, update)
        await self._report.history(
            record.order_id,
            H.STEP_FAILED,
            attempt=record.attempt,
            instance_id=instance,
            step=step,
            error=error.message,
        )
        await self._report.history(
            record.order_id,
            H.ERROR_RAISED,
            attempt=record.attempt,
            instance_id=instance,
            kind=error.kind.value,
        )
        await self._report.alert(
            AlertKind.ORDER_ERROR,
            f"order {record.order_id} in Error: {error.message}",
            alert_id=f"order-error:{record.order_id}:{record.attempt}",
            order_id=record.order_id,
            error_kind=error.kind.value,
            step=step,
        )
        await self._report.status(
            record.order_id,
            record.reply_to,
            OrderStatus.FAILED,
            after.process_state,
            message_id=f"{record.order_id}:status:failed:{record.attempt}",
            detail=error.message,
        )

    async def _write(self, order_id: str, update: Any) -> StateRecord:
        after = await self._store.update_state(order_id, update.expect, update.changes)
        if after is None:
            raise Superseded(order_id)
        return after


def _payload(order: OrderRecord, step: StepDefinition) -> dict[str, Any]:
    """What the remote operation needs of the order (never the payment details in clear)."""
    data = order.data
    if step.agent == "inventory":
        return {"items": [{"sku": line.sku, "quantity": line.quantity} for line in data.lines]}
    if step.agent == "payment":
        return {
            "amount_cents": data.total_cents,
            "currency": data.currency,
            "payment_token": data.payment_token,
        }
    return {
        "country": data.shipping_address.country,
        "postal_code": data.shipping_address.postal_code,
    }
