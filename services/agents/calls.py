"""The attempt loop of one step request: remote calls retried on transient failures only, each
taking an attempt ticket of the request's allowance first, behind the circuit breaker of its
operation, and none started once too little is left before the deadline (DESIGN §6). What the
loop ends with is an `Outcome`; the agent replies, or stays silent, by it (services/agents/
agent.py and replies.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import pybreaker
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception,
    wait_exponential_jitter,
)
from tenacity.wait import wait_base

from services.agents.attempts import Allowance
from services.agents.breakers import Breakers
from shared.domain.messages import StepRequest
from shared.domain.timing import utcnow
from shared.errors import (
    AllowanceSpent,
    DeadlinePassed,
    PermanentError,
    RemoteFenced,
    RemoteRefused,
    RemoteUndone,
    ServiceUnavailable,
    TransientError,
)
from shared.metrics import AGENT_ATTEMPTS
from shared.remote.client import RemoteCalls

DEADLINE_MARGIN_S = 0.02
"""Too little time left to start a call and hear its answer: do not start it."""


RETRY_WAIT: wait_base = wait_exponential_jitter(multiplier=0.05, max=1.0, jitter=0.05)
"""The pause between two attempts of one request."""

DEADLINE_FIRST = "the deadline came first; staying silent (the scheduler stopped waiting)"
CIRCUIT_OPEN = "circuit open, no call made; staying silent (the deadline paces the retries)"


def retried(exc: BaseException) -> bool:
    """Failures of a call that another attempt may mend: not the end of the allowance, not
    an outage of our own store (the consumer holds the message and runs us again), and not a
    refusal of our key or of the request's signature (trying again at once cannot mend it: the
    step is given back, and a later attempt, with the keys mended, passes)."""
    return isinstance(exc, TransientError) and not isinstance(
        exc, AllowanceSpent | ServiceUnavailable | RemoteRefused
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


class StepCalls:
    """Calls the remote service for the requests of agent `agent`."""

    def __init__(
        self, agent: str, client: RemoteCalls, breakers: Breakers, *, http_timeout_s: float
    ) -> None:
        self._agent = agent
        self._client = client
        self._breakers = breakers
        self._http_timeout_s = http_timeout_s

    async def run(self, request: StepRequest, allowance: Allowance) -> Outcome:
        """Call until a result, a permanent error, the end of the allowance or the deadline."""
        outcome = Outcome()
        breaker = self._breakers.get(request.operation)
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
            outcome.silent, outcome.transient = _stopped(request, outcome, exc)
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
                    fencing_signature=request.fencing_signature,
                    payload=request.payload,
                    timeout=min(left, self._http_timeout_s),
                )
        except Exception as exc:
            self._count(request.operation, attempt_outcome(exc, called=called))
            if isinstance(exc, TransientError):
                outcome.last_failure = str(exc)  # what AllowanceSpent says, if it comes next
            raise
        self._count(request.operation, "ok")
        return {"outcome": answer.get("outcome"), **dict(answer.get("result") or {})}

    def _count(self, operation: str, outcome: str) -> None:
        AGENT_ATTEMPTS.labels(self._agent, operation, outcome).inc()


def _stopped(
    request: StepRequest, outcome: Outcome, exc: BaseException
) -> tuple[str | None, str | None]:
    """(why the agent stays silent, or the transient failure it answers) when transient
    failures or an open circuit ended the retries."""
    if (request.complete_by - utcnow()).total_seconds() <= DEADLINE_MARGIN_S:
        # The deadline ended the retries (a hung call is cut off right at it): the scheduler
        # has stopped waiting, and a reply would only race its timer. The supervisor recovers
        # the step, as for any deadline.
        return DEADLINE_FIRST, None
    if outcome.attempts:
        # Attempts were spent (here or by an earlier handling): say so, and the scheduler
        # gives the order back at once.
        return None, str(exc)
    # An open circuit that let no call through stays silent: the step's deadline paces the
    # retries while the remote service is down (decision:open-circuit-fails-fast).
    return CIRCUIT_OPEN, None
