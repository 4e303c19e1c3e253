"""What a consumer hands its handler, the policy it consumes by, and how it reads a failure."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, TypeVar

from tenacity import (
    AsyncRetrying,
    retry_if_exception,
    wait_exponential,
    wait_random,
)

from shared.backoff import stop_after
from shared.broker.port import Incoming
from shared.domain.coordination import InboxOutcome
from shared.domain.messages import (
    AlertMessage,
    Contract,
    OrderStatusUpdate,
    StepReply,
    StepRequest,
    SubmitOrder,
)
from shared.errors import (
    PermanentError,
    PublishError,
    PublishUnroutable,
    ServiceUnavailable,
    one_line,
)

log = logging.getLogger("shared.broker.consumer")

R = TypeVar("R")


def is_outage(exc: BaseException) -> bool:
    """A store or broker that cannot be reached: not the message's fault, and it stops every
    message alike. An unroutable publish is not one (a queue is missing: that may be fixed)."""
    if isinstance(exc, PublishError):
        return not isinstance(exc, PublishUnroutable)
    return isinstance(exc, ServiceUnavailable)


TakenAlong = Mapping[tuple[str, str], InboxOutcome]
"""The outcomes of the claims made along with a delivery's own, by (inbox queue, message id)."""


@dataclass(frozen=True)
class Delivery:
    """What a handler gets: the validated contract and the envelope around it."""

    message: Contract
    message_id: str
    correlation_id: str | None
    reply_to: str | None
    headers: dict[str, Any]
    deliveries: int
    """1 on the first delivery; more when the broker redelivers."""
    user_id: str | None = None
    """The publisher's broker user when it set `user_id` (RabbitMQ checks it is the connection's
    user, so it cannot be forged); kept across delayed retries."""
    retries: int = 0
    """Delayed retries this message has had (0 the first time it is handled)."""
    taken_along: TakenAlong = field(default_factory=dict)
    """The outcomes of the claims made along with this delivery's inbox claim, by (inbox
    queue, message id): what its handler asked to have claimed first
    (decision:first-attempt-ticket-with-inbox-claim)."""


Handler = Callable[[Delivery], Awaitable[None]]
PoisonHook = Callable[[str, str, str], Awaitable[None]]
"""Called after a dead-letter with (reason, error, message id)."""


@dataclass(frozen=True)
class ConsumerPolicy:
    prefetch: int
    redelivery_limit: int
    max_message_bytes: int
    dedupe_window: timedelta
    claim_ttl: timedelta
    handler_timeout: float
    outage_patience: float = 300.0
    """How long a message is held, retrying, while a server it needs is unavailable; then it
    goes back to its queue (through its retry queue, after `retry_delay`) without counting as a
    delivery."""
    delayed_retries: int = 3
    """Times a message whose handler failed unexpectedly is set aside and tried again."""
    retry_delay: float = 10.0
    """Seconds a message set aside waits in the retry queue before it comes back."""
    own_user: str | None = None
    """This process's broker user: the `user_id` of all it publishes (see Envelope.sender)."""
    user_prefix: str | None = None
    """How the services' broker users are named (shared/broker/senders.py); None: `<hub>-`."""
    seal_key: bytes | None = None
    """The key of this consumer's dead-letter seals (shared/broker/seal.py); None: none made,
    and no replay accepted from another user than this process's own."""
    clock_skew: timedelta = timedelta(0)
    """How far another consumer's clock may be from ours: its claim on a message id is taken
    over only once it expired by more than this."""
    outage_backoff_cap: float = 5.0
    busy_wait: float = 2.0
    """How long a delivery whose message id another delivery has claimed waits in hand for
    that claim to end, before the message goes back to its queue, uncounted."""
    busy_poll: float = 0.5


def order_fields(contract: Contract) -> dict[str, str | None]:
    """The order a message is about, as log fields (the fencing token names the instance)."""
    if isinstance(contract, StepRequest | StepReply):
        return {
            "order_id": contract.order_id,
            "instance_id": contract.fencing_token,
            "step": contract.step,
        }
    if isinstance(contract, SubmitOrder):
        return {"order_id": contract.order.order_id}
    if isinstance(contract, OrderStatusUpdate):
        return {"order_id": contract.order_id}
    if isinstance(contract, AlertMessage):
        return {"order_id": contract.alert.order_id}
    return {}


def delivery_count(message: Incoming, before: int = 0) -> int:
    """Deliveries so far that count towards the redelivery limit, this one included: quorum
    queues count failed returns in a header (from RabbitMQ 4.3 only `basic.reject` counts, not
    `basic.nack`); `before` is what earlier copies of the message had counted (a message held
    through an outage goes back to its queue as a copy that carries the count, not adds to it).

    On a first delivery (not `redelivered`) the header is whatever the sender wrote: the broker
    writes it only on a redelivery (RabbitMQ 3.10 on every return, over the sender's; 4.3 on a
    counted one only), so it counts for nothing then (issue 33: a sender's `x-delivery-count:
    99` dead-lettered its order at once). The consumer sends such a message round as a clean
    copy (`Detours.return_clean`), so that no redelivery reads it either."""
    if not message.redelivered:
        return before + 1
    returned = (message.headers or {}).get("x-delivery-count")
    if isinstance(returned, int) and not isinstance(returned, bool) and returned >= 0:
        return before + returned + 1
    return before + 2


INTAKE_HEALTHY = frozenset({"consuming", "paused"})
"""Intake states in which a consumer is doing its job (`paused`: admission control chose to)."""


def intake_state(
    *,
    started: bool,
    paused: bool,
    subscribed: bool,
    ready: int | None,
    idle_s: float,
    stall_after_s: float,
) -> str:
    """What a consumer's intake is doing: `consuming`; `paused` on purpose; `not-subscribed`
    (the broker no longer delivers to it: its channel closed, or the broker cancelled it);
    `stalled` (messages wait in its queue and it has taken none for `stall_after_s`)."""
    if not started:
        return "not-started"
    if paused:
        return "paused"
    if not subscribed:
        return "not-subscribed"
    if ready and idle_s > stall_after_s:
        return "stalled"
    return "consuming"


async def held(operation: Callable[[], Awaitable[R]], *, patience: float, backoff_cap: float) -> R:
    """`operation()`, and through an outage the same again with exponential backoff and jitter
    (tenacity) until it passes or `patience` seconds have gone (then the outage is raised).
    The first try costs no retry machinery: every message takes this way."""
    try:
        return await operation()
    except Exception as exc:
        if not is_outage(exc):
            raise
        log.warning(
            "a server is unavailable; holding the message and retrying",
            extra={"error": one_line(exc)},
        )
    async for attempt in AsyncRetrying(
        retry=retry_if_exception(is_outage),
        wait=wait_exponential(multiplier=0.1, max=backoff_cap) + wait_random(0, 0.5),
        stop=stop_after(patience),
        reraise=True,
    ):
        with attempt:
            return await operation()
    raise AssertionError("tenacity ends in a return or a raise")  # pragma: no cover


def reason_of(exc: PermanentError) -> str:
    """The dead-letter reason of a failure that will fail the same way again."""
    return str(getattr(exc, "reason", "permanent"))
