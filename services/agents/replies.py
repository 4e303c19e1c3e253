"""What an agent answers a step request, and the one line it logs about it.

The answer is ok with the result, or an error: permanent (declined, fenced, undone, rejected) or
transient (its allowance spent, with the attempts used). A request whose attempt loop ended in
silence (services/agents/calls.py) gets no answer. A request that ends without a result is logged
once at INFO with why; a success only at DEBUG (one INFO line per step would cost more than the
step's other work at full throughput).
"""

from __future__ import annotations

import asyncio
import logging

from tenacity import (
    AsyncRetrying,
    RetryCallState,
    RetryError,
    retry_if_exception,
    wait_exponential_jitter,
)

from services.agents.calls import Outcome
from shared.broker.consumer import Delivery
from shared.broker.delivery import is_outage
from shared.broker.publisher import Publishing
from shared.domain.messages import StepOutcome, StepReply, StepRequest
from shared.domain.states import ErrorKind
from shared.domain.timing import utcnow
from shared.errors import (
    PermanentError,
    PublishError,
    PublishUnroutable,
    RemoteDeclined,
    RemoteFenced,
    RemoteUndone,
)

# The agent's lines, under its name whichever part of it writes them.
log = logging.getLogger("services.agents.agent")

REJECTED = "the remote service rejected the request; replying with a permanent error"
REFUSALS: dict[type[PermanentError], str] = {
    RemoteDeclined: "the remote service declined the step; replying with a permanent error",
    RemoteFenced: "fenced: the remote service refused a superseded attempt; replying so",
    RemoteUndone: "the step was undone first: the remote service refused its effect; replying so",
}


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


def reply_of(request: StepRequest, outcome: Outcome) -> StepReply:
    """The answer to `request` by its outcome (one that is not silent)."""
    if outcome.error is None and outcome.transient is None:
        return StepReply(
            order_id=request.order_id,
            step=request.step,
            action=request.action,
            fencing_token=request.fencing_token,
            idempotency_key=request.idempotency_key,
            outcome=StepOutcome.OK,
            attempts_used=outcome.attempts,
            result=outcome.result,
        )
    kind = ErrorKind.PERMANENT if outcome.error is not None else ErrorKind.TRANSIENT
    message = str(outcome.error) if outcome.error is not None else str(outcome.transient)
    if isinstance(outcome.error, RemoteFenced):
        # Not the step's failure: another attempt acted at this attempt's number or above. A
        # superseded attempt's release matches nothing; the attempt that still holds the
        # order (another claim at its number was rolled back, and acted) gives it back, and
        # the next claim's higher number passes the fence (decision:fencing-token-nonce).
        kind = ErrorKind.TRANSIENT
        message = f"superseded: {message}"
    return StepReply(
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


async def send_reply(
    publisher: Publishing,
    exchange: str,
    request: StepRequest,
    delivery: Delivery,
    reply: StepReply,
) -> None:
    """Publish the reply to `request` (which `delivery` brought), to the queue it names.

    The effect is done and recorded; the reply is all the scheduler waits for. So a broker that
    does not take it (a connection failing over to another node, a queue between leaders) is
    tried again, with backoff, until the step's deadline: past it the scheduler has stopped
    waiting and the supervisor recovers the step, which finds the effect done. Returning
    without a reply while the broker was merely away would lose it for good: the request is
    then acknowledged and its message id marked handled, so a redelivery is a duplicate."""
    loop = asyncio.get_running_loop()
    until = loop.time() + max(0.0, (request.complete_by - utcnow()).total_seconds())

    def past_the_deadline(state: RetryCallState) -> bool:
        return loop.time() + (state.upcoming_sleep or 0.0) >= until  # its pause counted too

    try:
        async for attempt in AsyncRetrying(
            stop=past_the_deadline,
            wait=wait_exponential_jitter(multiplier=0.1, max=1.0, jitter=0.1),
            retry=retry_if_exception(is_outage),
        ):
            with attempt:
                # The first try has the publisher's own timeout; a try again, what is left.
                again = attempt.retry_state.attempt_number > 1
                try:
                    async with asyncio.timeout(max(0.0, until - loop.time()) if again else None):
                        await publisher.publish(
                            reply,
                            exchange=exchange,
                            routing_key=request.reply_to,
                            message_id=f"{delivery.message_id}:reply",
                            # The request's own (random) correlation id: the only one its
                            # scheduler takes.
                            correlation_id=delivery.correlation_id,
                        )
                except TimeoutError:
                    raise PublishError("the broker took no reply by the step's deadline") from None
    except PublishUnroutable:
        # The scheduler that asked is gone: late replies are ignored by design.
        log.info("reply queue is gone; dropping the reply")
    except RetryError as exc:
        log.warning(
            "could not publish the reply by the step's deadline; the supervisor recovers "
            "the step, and finds its effect done",
            extra={"error": str(exc.last_attempt.exception())},
        )
