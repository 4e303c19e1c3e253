"""Running one claimed attempt of an order's workflow, step by step (DESIGN §4).

Every write is fenced by the attempt's instance id; when a write matches nothing the attempt was
superseded and stops touching anything. When a step's deadline passes first, the attempt stops
waiting and leaves the record Processing for the supervisor. A failure the workflow compensates
moves the order to Compensating, and the same attempt goes on to undo what it did. How a failed
step ends the attempt (given back, parked, or compensated) is services/scheduler/failures.py.
"""

from __future__ import annotations

import logging
from typing import Any

from services.scheduler.compensator import Compensator
from services.scheduler.context import AttemptContext
from services.scheduler.failures import Failures
from shared.domain.journal import CompensationEntry, HistoryEvent
from shared.domain.journal import HistoryEventType as H
from shared.domain.messages import OrderStatus, StepAction, StepOutcome, StepReply
from shared.domain.models import ErrorInfo, OrderRecord, StateRecord
from shared.domain.states import ErrorKind, ProcessState, StepStatus
from shared.domain.timing import utcnow
from shared.domain.updates import Update, apply, chain, complete_step, start_step
from shared.domain.workflow import (
    StepDefinition,
    Workflow,
    get_workflow,
    idempotency_key,
    unknown_version,
)
from shared.errors import Superseded
from shared.telemetry import bind_log_fields, log_fields

log = logging.getLogger(__name__)


class OrderRunner:
    def __init__(self, ctx: AttemptContext, compensator: Compensator) -> None:
        self._ctx = ctx
        self._compensator = compensator
        self._failures = Failures(ctx)

    async def run(self, record: StateRecord) -> None:
        instance_id = record.locked_by or ""
        # This attempt is a task of its own: every line it logs carries these.
        bind_log_fields(order_id=record.order_id, instance_id=instance_id)
        # ExecutionStarted was appended for the whole claimed batch by the scheduler.
        try:
            compensating = await self._run(record, instance_id)
        except Superseded:
            log.info(
                "attempt superseded; stopping without a write",
                extra={"order_id": record.order_id, "instance_id": instance_id},
            )
            await self._ctx.report.history(
                record.order_id, H.LEASE_LOST, attempt=record.attempt, instance_id=instance_id
            )
            return
        if compensating is not None:
            await self._compensator.run(compensating)

    async def _run(self, record: StateRecord, instance_id: str) -> StateRecord | None:
        """Run the steps not yet Completed; the record if it must now be compensated."""
        begun = await self._begin(record, instance_id)
        if begun is None:
            return None
        workflow, order = begun
        current = record
        # Whether the step about to run was started by the write that completed the last one.
        started = False
        for i, step in enumerate(workflow.steps):
            if current.steps[step.name].status is StepStatus.COMPLETED:
                continue  # a checkpoint: never run again
            following = _following(workflow, current, i)
            with log_fields(step=step.name):
                outcome, started = await self._run_step(
                    current,
                    order,
                    workflow,
                    step,
                    instance_id,
                    started=started,
                    following=following,
                )
            if outcome is None:
                return None  # the deadline passed: left Processing for the supervisor
            if outcome.process_state is ProcessState.COMPENSATING:
                return outcome
            if outcome.process_state is not ProcessState.PROCESSING:
                return None  # Processed, or parked in Error
            current = outcome
        return None

    async def _begin(
        self, record: StateRecord, instance_id: str
    ) -> tuple[Workflow, OrderRecord] | None:
        """The workflow and the order the attempt runs (with the Processing status sent on a
        first attempt); None when either is missing, and the order failed for it."""
        workflow = get_workflow(record.workflow, record.workflow_version)
        unknown = unknown_version(record)
        if unknown is not None:
            # A newer build started it, or an old version was retired too early: an operator
            # deploys a build that has it and resubmits. Never guess with another version.
            error = ErrorInfo(kind=ErrorKind.UNKNOWN_WORKFLOW, at=utcnow(), message=unknown)
            await self._failures.fail(record, None, None, instance_id, error)
            return None
        order = await self._ctx.order(record.order_id)
        if workflow is None or order is None:
            error = ErrorInfo(
                kind=ErrorKind.PERMANENT,
                at=utcnow(),
                message=f"no order record for {record.workflow} v{record.workflow_version}",
            )
            await self._failures.fail(record, None, None, instance_id, error)
            return None
        if record.attempt == 1:
            await self._ctx.report.status(
                record.order_id,
                record.reply_to,
                OrderStatus.PROCESSING,
                record.process_state,
                message_id=f"{record.order_id}:status:processing",
            )
        return workflow, order

    def _start(
        self, record: StateRecord, order: OrderRecord, step: StepDefinition, instance_id: str
    ) -> tuple[Update, HistoryEvent, CompensationEntry] | None:
        """The write that starts a step, its StepScheduled event and its undo; None when the
        retry budget has nothing left for it."""
        ctx = self._ctx
        if record.retry_budget.remaining < 1:
            return None
        allowance = min(ctx.rules.attempts_per_request, record.retry_budget.remaining)
        update = start_step(
            record,
            step.name,
            instance=instance_id,
            now=utcnow(),
            timeout=ctx.rules.step_timeout,
            allowance=allowance,
        )
        # The undo is logged with the step's start, before the effect can exist, so a crash can
        # never leave an effect without its undo on record (an undo of an effect never made is
        # a no-op remotely).
        undo = CompensationEntry(
            order_id=order.order_id,
            step=step.name,
            undo=step.undo,
            recorded_at=utcnow(),
            idempotency_key=idempotency_key(order.order_id, step.name, undo=True),
        )
        scheduled = ctx.event(
            record,
            H.STEP_SCHEDULED,
            instance_id,
            step=step.name,
            complete_by=update.changes.fields["complete_by"].isoformat(),
            allowance=allowance,
        )
        return update, scheduled, undo

    async def _run_step(
        self,
        record: StateRecord,
        order: OrderRecord,
        workflow: Workflow,
        step: StepDefinition,
        instance_id: str,
        *,
        started: bool,
        following: StepDefinition | None,
    ) -> tuple[StateRecord | None, bool]:
        """Run one step: the record it leaves (None: the deadline passed), and whether that
        write also started `following`."""
        # When `started`, the write that completed the previous step started this one.
        running = record if started else await self._start_step(record, order, step, instance_id)
        if running is None:
            error = ErrorInfo(
                kind=ErrorKind.BUDGET_EXHAUSTED,
                at=utcnow(),
                message=f"retry budget of {record.retry_budget.limit} attempts spent",
            )
            return await self._failures.fail(record, workflow, step.name, instance_id, error), False
        reply = await self._ask(running, order, step, instance_id)
        if reply is None:
            await self._ctx.report.history(
                record.order_id,
                H.DEADLINE_EXPIRED,
                attempt=record.attempt,
                instance_id=instance_id,
                step=step.name,
            )
            return None, False
        if reply.outcome is StepOutcome.OK:
            return await self._complete(
                running, order, workflow, step, instance_id, reply, following
            )
        failed = await self._failures.of_reply(running, workflow, step.name, instance_id, reply)
        return failed, False

    async def _start_step(
        self, record: StateRecord, order: OrderRecord, step: StepDefinition, instance_id: str
    ) -> StateRecord | None:
        """The record once the step is started; None when the retry budget has nothing left."""
        start = self._start(record, order, step, instance_id)
        if start is None:
            return None
        update, scheduled, undo = start
        return await self._ctx.write(
            record.order_id, update, history=[scheduled], compensation=undo
        )

    async def _ask(
        self, running: StateRecord, order: OrderRecord, step: StepDefinition, instance_id: str
    ) -> StepReply | None:
        """Send the step's request and wait for its reply; None when the deadline came first."""
        assert running.complete_by is not None
        ctx = self._ctx
        state = running.steps[step.name]
        return await ctx.ask(
            step.agent,
            f"{instance_id}:{step.name}:{state.attempts}",
            renew=ctx.renewer(running, instance_id),
            order_id=order.order_id,
            step=step.name,
            action=StepAction.DO,
            operation=step.operation,
            fencing_token=instance_id,
            idempotency_key=idempotency_key(order.order_id, step.name),
            complete_by=running.complete_by,
            attempts_allowed=state.allowance,
            payload=_payload(order, step),
        )

    async def _complete(
        self,
        running: StateRecord,
        order: OrderRecord,
        workflow: Workflow,
        step: StepDefinition,
        instance_id: str,
        reply: StepReply,
        following: StepDefinition | None,
    ) -> tuple[StateRecord, bool]:
        """Record the step's result and, in the same write, start the following step: one
        statement instead of two for every step but the last (what a crash between them would
        leave is the same as a crash just after a start)."""
        ctx = self._ctx
        update = complete_step(
            running,
            workflow,
            step.name,
            instance=instance_id,
            now=utcnow(),
            result=reply.result or {},
            attempts_used=reply.attempts_used,
        )
        events = [
            ctx.event(
                running,
                H.STEP_COMPLETED,
                instance_id,
                step=step.name,
                attempts_used=reply.attempts_used,
            )
        ]
        undo: CompensationEntry | None = None
        if workflow.is_last(step.name):
            events.append(ctx.event(running, H.EXECUTION_COMPLETED, instance_id))
        elif following is not None:
            update, scheduled, undo = self._and_start(
                running, update, order, following, instance_id
            )
            if scheduled is not None:
                events.append(scheduled)
        after = await ctx.write(running.order_id, update, history=events, compensation=undo)
        if after.process_state is ProcessState.PROCESSED:
            await ctx.report.status(
                running.order_id,
                running.reply_to,
                OrderStatus.COMPLETED,
                after.process_state,
                message_id=f"{running.order_id}:status:completed",
            )
        return after, undo is not None

    def _and_start(
        self,
        running: StateRecord,
        update: Update,
        order: OrderRecord,
        following: StepDefinition,
        instance_id: str,
    ) -> tuple[Update, HistoryEvent | None, CompensationEntry | None]:
        """`update` chained with the start of `following`, with that start's event and undo;
        `update` alone when the retry budget has nothing left for `following`."""
        completed = apply(running, update.changes)
        start = self._start(completed, order, following, instance_id)
        if start is None:
            return update, None, None
        next_update, scheduled, undo = start
        return chain(update, next_update, after_first=completed), scheduled, undo


def _following(workflow: Workflow, record: StateRecord, i: int) -> StepDefinition | None:
    """The first step after the `i`-th that `record` has not Completed."""
    return next(
        (
            s
            for s in workflow.steps[i + 1 :]
            if record.steps[s.name].status is not StepStatus.COMPLETED
        ),
        None,
    )


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
