"""An agent: runs one kind of step against the remote service, within its allowance and deadline.

DESIGN §6: tenacity retries transient failures only, stopped by the request's attempt allowance
and its deadline; a pybreaker circuit breaker per remote endpoint fails fast while the endpoint is
down; no new side effect starts after the deadline. The agent answers ok or a non-transient error;
once transient failures spent its allowance it answers `transient` with the attempts used, so the
attempt gives the order back at once (README decision 27, a departure from DESIGN §6's silence).
It stays silent when the deadline came first or an open circuit let no call through, and the
supervisor recovers the step after its deadline.

The allowance holds across every handling of a request (services/agents/attempts.py): each call
takes an attempt ticket first, durably, so a handling run again after a store outage or an
unexpected exception, or a request delivered again, spends only what earlier handlings left,
and the reply reports the attempts of them all.

Each request's lines carry its `order_id`, `instance_id` (the fencing token), `step` and
`operation`. A request that ends without a result is logged once at INFO with why; a success only
at DEBUG (one INFO line per step would cost more than the step's other work at full throughput).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import pybreaker
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception,
    wait_exponential_jitter,
)
from tenacity.wait import wait_base

from services.agents.attempts import Allowance, InboxTickets, Tickets
from services.agents.breakers import Breakers
from services.remote.client import RemoteCalls, RemoteClient
from shared.bootstrap import Runtime
from shared.broker.consumer import Delivery
from shared.broker.dedupe import inbox_key
from shared.broker.publisher import Publishing
from shared.broker.topology import Names
from shared.config import Settings
from shared.domain.journal import AlertKind, Severity
from shared.domain.messages import StepOutcome, StepReply, StepRequest
from shared.domain.states import ErrorKind
from shared.domain.timing import utcnow
from shared.errors import (
    AllowanceSpent,
    DeadlinePassed,
    InvalidMessage,
    PermanentError,
    PublishError,
    PublishUnroutable,
    RemoteDeclined,
    RemoteFenced,
    RemoteUndone,
    ServiceUnavailable,
    TransientError,
)
from shared.metrics import AGENT_ATTEMPTS
from shared.reporting import Reporter
from shared.telemetry import log_fields

log = logging.getLogger(__name__)

DEADLINE_MARGIN_S = 0.02
"""Too little time left to start a call and hear its answer: do not start it."""


RETRY_WAIT: wait_base = wait_exponential_jitter(multiplier=0.05, max=1.0, jitter=0.05)
"""The pause between two attempts of one request."""


def retried(exc: BaseException) -> bool:
    """Failures of a call that another attempt may mend: not the end of the allowance, and
    not an outage of our own store (the consumer holds the message and runs us again)."""
    return isinstance(exc, TransientError) and not isinstance(
        exc, AllowanceSpent | ServiceUnavailable
    )


@dataclass
class Outcome:
    result: dict[str, Any] | None = None
    error: PermanentError | None = None
    transient: str | None = None
    """The last transient failure, when the allowance (or an open circuit) stopped the step."""
    silent: str | None = None
    """Why no answer is sent: the deadline came first, or an open circuit let no call through."""
    attempts: int = 0
    """Attempts spent on the request, by this handling and earlier ones (tickets taken)."""
    calls: int = 0
    """Calls this handling made."""
    last_failure: str | None = None
    """This handling's last transient failure of a call (what a spent allowance reports)."""


REJECTED = "the remote service rejected the request; replying with a permanent error"
REFUSALS: dict[type[PermanentError], str] = {
    RemoteDeclined: "the remote service declined the step; replying with a permanent error",
    RemoteFenced: "fenced: the remote service refused a superseded attempt; replying so",
    RemoteUndone: "the step was undone first: the remote service refused its effect; replying so",
}
DEADLINE_FIRST = "the deadline came first; staying silent (the scheduler stopped waiting)"
CIRCUIT_OPEN = "circuit open, no call made; staying silent (the deadline paces the retries)"


def log_outcome(outcome: Outcome) -> None:
    """One line per request: INFO when it ended without a result, DEBUG when it succeeded."""
    if outcome.error is not None:
        log.info(
            REFUSALS.get(type(outcome.error), REJECTED),
            extra={"attempts": outcome.attempts, "error": str(outcome.error)},
        )
    elif outcome.transient is not None:
        log.info(
            "transient failures spent the allowance; replying so",
            extra={
                "attempts": outcome.attempts,
                "calls": outcome.calls,
                "error": outcome.transient,
            },
        )
    elif outcome.silent is not None:
        log.info(outcome.silent, extra={"attempts": outcome.attempts, "calls": outcome.calls})
    elif log.isEnabledFor(logging.DEBUG):  # the hot path: no dict built for a dropped line
        result = (outcome.result or {}).get("outcome")
        log.debug("step done", extra={"attempts": outcome.attempts, "outcome": result})


def _check_deadline(request: StepRequest) -> float:
    """Seconds left before the request's deadline; DeadlinePassed when too few to call."""
    left = (request.complete_by - utcnow()).total_seconds()
    if left <= DEADLINE_MARGIN_S:
        raise DeadlinePassed(f"deadline {request.complete_by.isoformat()} passed")
    return left


def _before_deadline(complete_by: datetime) -> Any:
    def stop(state: RetryCallState) -> bool:
        return (complete_by - utcnow()).total_seconds() <= DEADLINE_MARGIN_S

    return stop


class Agent:
    def __init__(
        self,
        name: str,
        client: RemoteCalls,
        publisher: Publishing,
        settings: Settings,
        *,
        tickets: Tickets,
    ) -> None:
        self.name = name
        self._client = client
        self._tickets = tickets
        self._publisher = publisher
        self._settings = settings
        self._replies = Names(settings.hub).replies
        self._breakers = Breakers(
            fail_max=settings.breaker_fail_max, reset_s=settings.breaker_reset_s
        )
        self._alerted: set[str] = set()
        self._ticket_keep = timedelta(seconds=settings.inbox_ttl_s)

    def breaker(self, operation: str) -> pybreaker.CircuitBreaker:
        return self._breakers.get(operation)

    def open_circuits(self) -> list[str]:
        return self._breakers.open()

    def status(self) -> dict[str, Any]:
        """This agent's part of its heartbeat."""
        return {
            "agent": self.name,
            "open_breakers": self._breakers.open(),
            "breakers": self._breakers.states(),
        }

    async def alert_open_circuits(self, report: Reporter, *, now: datetime) -> None:
        """Raise one `circuit-open` alert per opening that lasts beyond the threshold."""
        after = timedelta(seconds=self._settings.circuit_alert_after_s)
        for operation, opened_at in self._breakers.open_longer_than(after, now=now).items():
            since = opened_at.isoformat(timespec="microseconds")
            alert_id = f"circuit-open:{operation}:{since}:{report.source}"[:128]
            if alert_id in self._alerted:
                continue
            await report.alert(
                AlertKind.CIRCUIT_OPEN,
                f"the circuit of {operation} has been open since {since} "
                f"({(now - opened_at).total_seconds():.0f}s): is the remote service down?",
                alert_id=alert_id,
                severity=Severity.WARNING,
                operation=operation,
                opened_at=since,
            )
            self._alerted.add(alert_id)

    async def handle(self, delivery: Delivery) -> None:
        request = delivery.message
        if not isinstance(request, StepRequest):
            raise InvalidMessage(f"agent {self.name} takes step requests only", reason="wrong-type")
        if not request.operation.startswith(f"{self.name}."):
            raise InvalidMessage(f"{request.operation} is not an operation of agent {self.name}")
        # The consumer binds the first three already; binding them here too keeps the agent's
        # lines right however it is called.
        with log_fields(
            order_id=request.order_id,
            instance_id=request.fencing_token,
            step=request.step,
            operation=request.operation,
        ):
            if utcnow() >= request.complete_by:
                log.info("deadline passed before the agent got the request; no side effect")
                return
            allowance = Allowance(
                self._tickets,
                inbox_key(delivery),  # the request, as the inbox dedupes it: its sender's id
                request.attempts_allowed,
                # Kept past any deadline this request may carry (a re-publish extends it).
                keep_until=max(request.complete_by, utcnow()) + self._ticket_keep,
            )
            outcome = await self._run(request, allowance)
            log_outcome(outcome)
            if outcome.silent is None:
                await self._reply(request, delivery, outcome)

    async def _run(self, request: StepRequest, allowance: Allowance) -> Outcome:
        outcome = Outcome()
        breaker = self.breaker(request.operation)
        retrying = AsyncRetrying(
            # The allowance ends the retries (AllowanceSpent); the deadline may end them first.
            stop=_before_deadline(request.complete_by),
            wait=RETRY_WAIT,
            retry=retry_if_exception(retried),
            reraise=True,
        )
        try:
            async for attempt in retrying:
                with attempt:
                    outcome.result = await self._attempt(request, breaker, outcome, allowance)
        except ServiceUnavailable:
            raise  # our own store: the consumer holds the message and runs the handling again
        except PermanentError as exc:
            outcome.error = exc
        except DeadlinePassed:
            outcome.silent = DEADLINE_FIRST
        except (TransientError, pybreaker.CircuitBreakerError) as exc:
            outcome.attempts = allowance.spent
            if (request.complete_by - utcnow()).total_seconds() <= DEADLINE_MARGIN_S:
                # The deadline ended the retries (a hung call is cut off right at it): the
                # scheduler has stopped waiting, and a reply would only race its timer. The
                # supervisor recovers the step, as for any deadline.
                outcome.silent = DEADLINE_FIRST
            elif outcome.attempts:
                # Attempts were spent (here or by an earlier handling): say so, and the
                # scheduler gives the order back at once.
                outcome.transient = str(exc)
            else:
                # An open circuit that let no call through stays silent: the step's deadline
                # paces the retries while the remote service is down (decision 15).
                outcome.silent = CIRCUIT_OPEN
        outcome.attempts = allowance.spent
        return outcome

    async def _attempt(
        self,
        request: StepRequest,
        breaker: pybreaker.CircuitBreaker,
        outcome: Outcome,
        allowance: Allowance,
    ) -> dict[str, Any]:
        _check_deadline(request)
        # A ticket only for a call the breaker will let through: an open circuit fails fast
        # and spends no attempt (if it opens while the ticket is taken, or the deadline passes
        # meanwhile, the ticket is lost: counted as spent, the safe side).
        if self._breakers.lets_through(request.operation) and not await allowance.take():
            raise AllowanceSpent(
                outcome.last_failure
                or f"the allowance of {allowance.allowed} attempts was spent by an earlier "
                "handling of this request"
            )
        left = _check_deadline(request)
        # An open breaker raises on entry: it fails fast and spends no attempt. When its reset
        # time has come it lets this call through as the trial.
        called = False
        try:
            with breaker.calling():
                called = True
                outcome.calls += 1
                answer = await self._client.call(
                    request.operation,
                    order_id=request.order_id,
                    idempotency_key=request.idempotency_key,
                    fencing_token=request.fencing_token,
                    payload=request.payload,
                    timeout=min(left, self._settings.agent_http_timeout_s),
                )
        except Exception as exc:
            self._count(request.operation, attempt_outcome(exc, called=called))
            if isinstance(exc, TransientError):
                outcome.last_failure = str(exc)  # what AllowanceSpent says, if it comes next
            raise
        self._count(request.operation, "ok")
        return {"outcome": answer.get("outcome"), **dict(answer.get("result") or {})}

    def _count(self, operation: str, outcome: str) -> None:
        AGENT_ATTEMPTS.labels(self.name, operation, outcome).inc()

    async def _reply(self, request: StepRequest, delivery: Delivery, outcome: Outcome) -> None:
        if outcome.error is not None or outcome.transient is not None:
            kind = ErrorKind.PERMANENT if outcome.error is not None else ErrorKind.TRANSIENT
            message = str(outcome.error) if outcome.error is not None else str(outcome.transient)
            if isinstance(outcome.error, RemoteFenced):
                message = f"superseded: {message}"
            reply = StepReply(
                order_id=request.order_id,
                step=request.step,
                action=request.action,
                fencing_token=request.fencing_token,
                idempotency_key=request.idempotency_key,
                outcome=StepOutcome.ERROR,
                attempts_used=outcome.attempts,
                error_kind=kind,
                error_message=message[:2000],
            )
        else:
            reply = StepReply(
                order_id=request.order_id,
                step=request.step,
                action=request.action,
                fencing_token=request.fencing_token,
                idempotency_key=request.idempotency_key,
                outcome=StepOutcome.OK,
                attempts_used=outcome.attempts,
                result=outcome.result,
            )
        try:
            await self._publisher.publish(
                reply,
                exchange=self._replies,
                routing_key=request.reply_to,
                message_id=f"{delivery.message_id}:reply",
                # The request's own (random) correlation id: the only one its scheduler takes.
                correlation_id=delivery.correlation_id,
            )
        except PublishUnroutable:
            # The scheduler that asked is gone: late replies are ignored by design.
            log.info("reply queue is gone; dropping the reply")
        except PublishError:
            log.exception("could not publish a reply")


def attempt_outcome(exc: Exception, *, called: bool) -> str:
    """The `orderflow_agent_attempts_total` outcome of a remote call that raised `exc`."""
    if isinstance(exc, pybreaker.CircuitBreakerError):
        # Raised on entry by an open circuit (no call), or by the failed call that tripped it.
        return "transient" if called else "breaker_open"
    if isinstance(exc, RemoteFenced):
        return "fenced"
    if isinstance(exc, RemoteUndone):
        return "undone"
    if isinstance(exc, PermanentError):
        return "permanent"
    return "transient"


async def serve_agent(
    name: str,
    runtime: Runtime,
    stop: asyncio.Event,
    *,
    client: RemoteCalls | None = None,
    burst: bool = False,
) -> None:
    """Consume `<hub>.agent.<name>` until `stop` (in `burst` mode, until no request is left),
    then drain. `client`: how the remote service is reached (by default over HTTP at
    `ORDERFLOW_REMOTE_URL`)."""
    settings = runtime.settings
    if client is None:
        client = RemoteClient.open(
            settings.remote_url, pool=max(10, settings.prefetch * 2), account=settings.hub
        )
    tickets = InboxTickets(runtime.store, runtime.names.agent(name))
    agent = Agent(name, client, runtime.publisher, settings, tickets=tickets)
    report = runtime.reporter()

    async def check_circuits() -> None:
        await agent.alert_open_circuits(report, now=utcnow())

    consumer = await runtime.consumer(runtime.names.agent(name), agent.handle)
    try:
        async with runtime.heartbeat(f"agent-{name}", agent.status, (check_circuits,)):
            await consumer.start()
            log.info("agent ready", extra={"agent": name})
            if burst:
                runtime.burst(stop)
            try:
                await stop.wait()
            finally:
                await consumer.stop(drain_timeout=settings.drain_timeout_s)
    finally:
        await client.close()
