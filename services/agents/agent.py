"""An agent: runs one kind of step against the remote service, within its allowance and deadline.

DESIGN §6: tenacity retries transient failures only, stopped by the request's attempt allowance
and its deadline; a pybreaker circuit breaker per remote endpoint fails fast while the endpoint is
down; no new side effect starts after the deadline. The agent answers ok or a non-transient error;
once transient failures spent its allowance it answers `transient` with the attempts used, so the
attempt gives the order back at once (decision:transient-failures-reported-not-waited-out, a
departure from DESIGN §6's silence).
It stays silent when the deadline came first or an open circuit let no call through, and the
supervisor recovers the step after its deadline.

The allowance holds across every handling of a request (services/agents/attempts.py): each call
takes an attempt ticket first, durably, so a handling run again after a store outage or an
unexpected exception, or a request delivered again, spends only what earlier handlings left,
and the reply reports the attempts of them all.

The attempt loop is services/agents/calls.py; the answer and the line logged about each request
are services/agents/replies.py. Each request's lines carry its `order_id`, `instance_id` (the
fencing token), `step` and `operation`.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import datetime, timedelta
from typing import Any

import pybreaker

from services.agents.attempts import Allowance, InboxTickets, Tickets, ticket_claim, ticket_id
from services.agents.breakers import Breakers
from services.agents.calls import DEADLINE_MARGIN_S, StepCalls
from services.agents.replies import log_outcome, reply_of, send_reply
from shared.bootstrap import Runtime
from shared.broker.consumer import Delivery
from shared.broker.dedupe import AlongClaim, inbox_key
from shared.broker.publisher import Publishing
from shared.broker.topology import Names
from shared.config import AgentSettings
from shared.domain.coordination import InboxOutcome
from shared.domain.journal import AlertKind, Severity
from shared.domain.messages import StepRequest
from shared.domain.timing import utcnow
from shared.errors import InvalidMessage
from shared.remote.client import RemoteCalls, RemoteClient
from shared.reporting import Reporter
from shared.telemetry import log_fields
from shared.tracing import aiohttp_trace_configs

log = logging.getLogger(__name__)


class Agent:
    def __init__(
        self,
        name: str,
        client: RemoteCalls,
        publisher: Publishing,
        settings: AgentSettings,
        *,
        hub: str,
        ticket_keep_s: float,
        tickets: Tickets,
        ticket_queue: str | None = None,
    ) -> None:
        """`ticket_queue`: the inbox queue of `tickets` when they are inbox claims, so the
        first can be taken along with a request's own inbox claim
        (decision:first-attempt-ticket-with-inbox-claim);
        `ticket_keep_s`: how long a ticket is kept (the broker's dedupe window)."""
        self.name = name
        self._tickets = tickets
        self._ticket_queue = ticket_queue
        self._publisher = publisher
        self._settings = settings
        self._replies = Names(hub).replies
        self._breakers = Breakers(
            fail_max=settings.breaker_fail_max, reset_s=settings.breaker_reset_s
        )
        self._calls = StepCalls(
            name, client, self._breakers, http_timeout_s=settings.agent_http_timeout_s
        )
        self._alerted: set[str] = set()
        self._ticket_keep = timedelta(seconds=ticket_keep_s)

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

    def along(self, delivery: Delivery) -> list[AlongClaim]:
        """The first attempt ticket of a request, to be taken with its inbox claim in one round
        trip, when its handling will want it: a request of this agent far enough before its
        deadline for a call, whose circuit lets calls through (as `StepCalls` asks before each
        ticket). Should either change in between, the ticket is lost: counted as spent, the
        safe side."""
        request = delivery.message
        if (
            self._ticket_queue is None
            or not isinstance(request, StepRequest)
            or not request.operation.startswith(f"{self.name}.")
            or request.attempts_allowed < 1
            or (request.complete_by - utcnow()).total_seconds() <= DEADLINE_MARGIN_S
            or not self._breakers.lets_through(request.operation)
        ):
            return []
        claim = ticket_claim(inbox_key(delivery), 1, keep_until=self._ticket_keep_until(request))
        return [AlongClaim(self._ticket_queue, claim)]

    def _ticket_keep_until(self, request: StepRequest) -> datetime:
        # Kept past any deadline this request may carry (a re-publish extends it).
        return max(request.complete_by, utcnow()) + self._ticket_keep

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
            key = inbox_key(delivery)  # the request, as the inbox dedupes it: its sender's id
            first = (
                None
                if self._ticket_queue is None
                else delivery.taken_along.get((self._ticket_queue, ticket_id(key, 1)))
            )
            allowance = Allowance(
                self._tickets,
                key,
                request.attempts_allowed,
                keep_until=self._ticket_keep_until(request),
                first=None if first is None else first is InboxOutcome.CLAIMED,
            )
            outcome = await self._calls.run(request, allowance)
            log_outcome(outcome)
            if outcome.silent is None:
                reply = reply_of(request, outcome)
                await send_reply(self._publisher, self._replies, request, delivery, reply)


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
        key = settings.remote.remote_account_key
        if key is None:
            log.warning(
                "ORDERFLOW_REMOTE_ACCOUNT_KEY is not set: the remote service refuses calls "
                "without the account's key"
            )
        client = RemoteClient.open(
            settings.remote.remote_url,
            pool=max(10, settings.broker.prefetch * 2),
            account=settings.hub,
            account_key=None if key is None else key.get_secret_value(),
            trace_configs=aiohttp_trace_configs(),
        )
    tickets = InboxTickets(runtime.store, runtime.names.agent(name))
    agent = Agent(
        name,
        client,
        runtime.publisher,
        settings.agents,
        hub=settings.hub,
        ticket_keep_s=settings.broker.inbox_ttl_s,
        tickets=tickets,
        ticket_queue=tickets.queue,
    )
    report = runtime.reporter()

    async def check_circuits() -> None:
        await agent.alert_open_circuits(report, now=utcnow())

    consumer = await runtime.consumer(runtime.names.agent(name), agent.handle, along=agent.along)
    try:
        async with runtime.heartbeat(f"agent-{name}", agent.status, (check_circuits,)):
            await consumer.start()
            log.info("agent ready", extra={"agent": name})
            if burst:
                runtime.burst(stop)
            try:
                await stop.wait()
            finally:
                await consumer.stop(drain_timeout=settings.process.drain_timeout_s)
    finally:
        await client.close()
