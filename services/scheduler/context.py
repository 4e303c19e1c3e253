"""What every attempt a scheduler runs needs: fenced writes, and asking an agent."""

from __future__ import annotations

import asyncio
import functools
import logging
import secrets
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from shared.backoff import Backoff
from shared.batching import GroupCommit
from shared.broker.delivery import is_outage
from shared.broker.private import Expected, ReplyRouter
from shared.broker.publisher import Publishing
from shared.broker.senders import agent_role
from shared.broker.topology import Names
from shared.config import Settings
from shared.crash import crash_point
from shared.domain.journal import CompensationEntry, HistoryEvent, HistoryEventType
from shared.domain.messages import StepAction, StepOutcome, StepReply, StepRequest
from shared.domain.models import OrderRecord, StateRecord
from shared.domain.states import ErrorKind
from shared.domain.timing import utcnow
from shared.domain.updates import RecoveryPolicy, Update, extend_deadline
from shared.domain.workflow import WORKFLOWS, Workflow
from shared.errors import PublishError, Superseded
from shared.metrics import STEP_OUTCOMES, STEP_SECONDS
from shared.policies import compensates, recovery_policy
from shared.remote.fencing import fence_signature
from shared.reporting import Reporter
from shared.store.port import StateStore, UndoMark

log = logging.getLogger(__name__)


STEP_OUTCOME_NAMES = (*(o.value for o in StepOutcome), "deadline")


def step_series_from_the_start() -> None:
    """Every step's latency and outcome series, at zero, from the scheduler's start: a series
    born with its first observation already counted is invisible to `rate` and `increase`, so
    the dashboard's step latency and outcomes would miss whatever happened between two scrapes
    after a (re)start (Prometheus's advice: initialise the label sets you know)."""
    for workflow in WORKFLOWS:
        for step in workflow.steps:
            for action in StepAction:
                STEP_SECONDS.labels(step.name, action.value)
                for outcome in STEP_OUTCOME_NAMES:
                    STEP_OUTCOMES.labels(step.name, action.value, outcome)


Renew = Callable[[], Awaitable[datetime]]
"""Extends the attempt's deadline (a fenced write) and returns the new one."""

ORDER_READ_BATCH = 100
"""Order records one read fetches at most."""


@dataclass(frozen=True)
class AttemptRules:
    """What the settings decide for every attempt, built once as the scheduler starts
    (`attempt_rules`): the deadlines, the allowances, the fence key and the policies."""

    step_timeout: timedelta
    attempts_per_request: int
    """Remote attempts one step request may spend (never more than the budget left)."""
    undo_attempts: int
    outage_patience_s: float
    fence_key: bytes | None
    recovery: RecoveryPolicy
    """How long a released order rests, and what happens at the failure threshold."""
    compensates: Callable[[Workflow, ErrorKind], bool]
    """Whether a failure of a kind compensates a workflow (else the order is parked)."""


def attempt_rules(settings: Settings) -> AttemptRules:
    """The rules the settings choose: the scheduler's bootstrap of its attempts."""
    key = settings.remote.remote_fence_key
    workflow = settings.workflow
    return AttemptRules(
        step_timeout=workflow.step_timeout,
        attempts_per_request=settings.agents.agent_attempts_per_request,
        undo_attempts=workflow.undo_attempts,
        outage_patience_s=settings.broker.outage_patience_s,
        fence_key=None if key is None else key.get_secret_value().encode(),
        recovery=recovery_policy(settings.supervisor, workflow),
        compensates=functools.partial(compensates, workflow),
    )


@dataclass
class AttemptContext:
    store: StateStore
    publisher: Publishing
    names: Names
    router: ReplyRouter
    reply_queue: str
    report: Reporter
    rules: AttemptRules
    _orders: GroupCommit[str, OrderRecord | None] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        # The attempts of one claimed batch start together: one read for all their orders.
        self._orders = GroupCommit(self.store.get_orders, max_batch=ORDER_READ_BATCH)

    def signature(self, fencing_token: str) -> str | None:
        """This hub's signature of an attempt's fencing token, which the remote service asks
        of every call (shared/remote/fencing.py); None without a fence key."""
        if self.rules.fence_key is None:
            return None
        return fence_signature(self.rules.fence_key, self.names.hub, fencing_token)

    async def order(self, order_id: str) -> OrderRecord | None:
        """The order record (read together with those of other attempts starting now)."""
        return await self._orders.submit(order_id)

    @property
    def policy(self) -> RecoveryPolicy:
        """How long a released order rests before it may be claimed again, as the supervisor's
        recoveries do, and what happens at the failure threshold."""
        return self.rules.recovery

    def event(
        self, record: StateRecord, type_: HistoryEventType, instance_id: str, **data: Any
    ) -> HistoryEvent:
        """A history event of the attempt `instance_id` of `record`'s order, to carry with a
        write of it."""
        return self.report.event(
            record.order_id, type_, attempt=record.attempt, instance_id=instance_id, **data
        )

    async def write(
        self,
        order_id: str,
        update: Update,
        *,
        history: Sequence[HistoryEvent] = (),
        compensation: CompensationEntry | None = None,
        undo: UndoMark | None = None,
    ) -> StateRecord:
        """Apply a fenced update, with the history events, the undo to log and the undo outcome
        that describe it (written only if it matched); raise `Superseded` when its condition no
        longer holds."""
        after = await self.store.update_state(
            order_id,
            update.expect,
            update.changes,
            history=history,
            compensation=compensation,
            undo=undo,
        )
        if after is None:
            raise Superseded(order_id)
        return after

    def renewer(self, record: StateRecord, instance_id: str) -> Renew:
        """A `Renew` for this attempt's record."""

        async def renew() -> datetime:
            update = extend_deadline(
                record,
                instance=instance_id,
                now=utcnow(),
                timeout=self.rules.step_timeout,
            )
            after = await self.write(record.order_id, update)
            assert after.complete_by is not None
            return after.complete_by

        return renew

    async def ask(
        self, agent: str, message_id: str, *, renew: Renew, **fields: Any
    ) -> StepReply | None:
        """Send a step request and race its reply against its deadline; None if the deadline
        won (the supervisor recovers the step) or the request cannot be routed."""
        labels = (str(fields["step"]), str(fields["action"]))
        started = asyncio.get_running_loop().time()
        reply = await self._ask(agent, message_id, renew, fields)
        if reply is None:
            STEP_OUTCOMES.labels(*labels, "deadline").inc()
        else:
            STEP_SECONDS.labels(*labels).observe(asyncio.get_running_loop().time() - started)
            STEP_OUTCOMES.labels(*labels, reply.outcome.value).inc()
        return reply

    async def _ask(
        self, agent: str, message_id: str, renew: Renew, fields: dict[str, Any]
    ) -> StepReply | None:
        # A random correlation id per request: no one can guess the one a reply needs.
        correlation_id = secrets.token_hex(16)
        expected = Expected(
            sender_role=agent_role(agent),
            order_id=str(fields["order_id"]),
            step=str(fields["step"]),
            action=StepAction(fields["action"]),
            fencing_token=str(fields["fencing_token"]),
            idempotency_key=str(fields["idempotency_key"]),
        )
        waiting = self.router.expect(correlation_id, expected)
        try:
            request = await self._send(agent, message_id, correlation_id, renew, fields)
            if request is None:
                return None
            undo = request.action is StepAction.UNDO
            crash_point("after-undo-request" if undo else "after-request")
            left = (request.complete_by - utcnow()).total_seconds()
            reply = await asyncio.wait_for(waiting, timeout=max(0.0, left))
        except TimeoutError:
            return None
        finally:
            self.router.forget(correlation_id)
        if not isinstance(reply, StepReply):
            log.warning("a non-reply on the reply queue", extra={"message_id": message_id})
            return None
        return reply

    async def _send(
        self,
        agent: str,
        message_id: str,
        correlation_id: str,
        renew: Renew,
        fields: dict[str, Any],
    ) -> StepRequest | None:
        """Publish the request. While the broker is away (a restart, however long), hold the
        order: keep its deadline ahead with fenced writes and publish again (same message id,
        so an agent that got an unconfirmed copy handles it once). A broker outage is not the
        order's fault, so it costs no retry budget and no recovery: were the attempt to give
        up, every recovery after it would meet the same outage, and the order would be parked
        at the failure threshold. Past the outage patience the wait is logged as an error
        (once); a request the broker cannot route (its queue is missing: no outage) is given
        up then, for the supervisor to recover."""
        loop = asyncio.get_running_loop()
        patience = loop.time() + self.rules.outage_patience_s
        told = False
        pauses = Backoff(first=0.2, cap=2.0)
        signature = self.signature(str(fields["fencing_token"]))
        while True:
            request = StepRequest(reply_to=self.reply_queue, fencing_signature=signature, **fields)
            try:
                await self.publisher.publish(
                    request,
                    exchange=self.names.exchange,
                    routing_key=self.names.agent(agent),
                    message_id=message_id,
                    correlation_id=correlation_id,
                )
                return request
            except PublishError as exc:
                context = {"order_id": request.order_id, "step": request.step, "error": str(exc)}
                past = loop.time() >= patience
                if past and not is_outage(exc):
                    log.error(
                        "could not send a step request; the supervisor will recover it",
                        extra=context,
                    )
                    return None
                if past and not told:
                    told = True
                    log.error(
                        "the broker has refused a step request for longer than the outage "
                        "patience; still holding the order",
                        extra=context,
                    )
                elif not past:
                    log.warning("could not send a step request; holding the order", extra=context)
            await asyncio.sleep(pauses.next())
            fields["complete_by"] = await renew()
