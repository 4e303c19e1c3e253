"""A process's private queues (a scheduler's replies, an application's statuses), binding an
application's status queues for it, and matching replies to requests."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aio_pika.abc import (
    AbstractChannel,
    AbstractIncomingMessage,
    AbstractQueue,
    AbstractRobustConnection,
)
from opentelemetry.trace import SpanKind

from shared.broker.envelope import shown, user_of
from shared.broker.senders import Senders
from shared.broker.topology import Names
from shared.domain.messages import Contract, StepAction, StepReply, decode
from shared.errors import ContractViolation, one_line
from shared.metrics import REPLIES_DROPPED
from shared.tracing import order_span

log = logging.getLogger(__name__)

Listener = Callable[[Contract, AbstractIncomingMessage], None]

STATUS_QUEUE_EXPIRES_MS = 15 * 60 * 1000
"""A status queue nobody has consumed from for this long is deleted by the broker."""
STATUS_QUEUE: dict[str, Any] = {
    "durable": True,
    "auto_delete": True,
    "arguments": {"x-expires": STATUS_QUEUE_EXPIRES_MS},
}
"""How an application's status queue is declared, and the only way submission binds one."""
BIND_TIMEOUT_S = 2.0


class PrivateQueue:
    """Replies are not precious: one lost is a deadline that passes, which the supervisor handles.
    So they are consumed without acks, and a bad one is logged and dropped, never requeued.

    The queue is bound, with its own name as the routing key, to the exchange that feeds queues
    of its kind (`Names.exchange_feeding`: `<hub>.replies` or `<hub>.status`), so that who may
    send to it is a matter of permissions on that exchange, never of the default exchange."""

    def __init__(
        self,
        connection: AbstractRobustConnection,
        name: str,
        listener: Listener,
        *,
        max_bytes: int,
        prefetch: int = 1000,
    ) -> None:
        self.name = name
        self._connection = connection
        self._listener = listener
        self._max_bytes = max_bytes
        self._prefetch = prefetch
        self._channel: AbstractChannel | None = None
        self._queue: AbstractQueue | None = None
        self._tag: str | None = None

    async def start(self) -> None:
        self._channel = await self._connection.channel()
        await self._channel.set_qos(prefetch_count=self._prefetch)
        feeding = Names.exchange_feeding(self.name)
        if feeding is not None and feeding.endswith(".status"):
            # An application's status queue: submission binds it (StatusBinder), so it may
            # not be exclusive to this connection; it goes when its last consumer does, or
            # after STATUS_QUEUE_EXPIRES_MS unused (a client that died).
            self._queue = await self._channel.declare_queue(self.name, **STATUS_QUEUE)
        else:
            self._queue = await self._channel.declare_queue(
                self.name, exclusive=True, auto_delete=True, durable=False
            )
            if feeding is not None:
                await self._queue.bind(feeding, routing_key=self.name)
        self._tag = await self._queue.consume(self._on_message, no_ack=True)

    async def stop(self) -> None:
        if self._queue is not None and self._tag is not None:
            with contextlib.suppress(Exception):
                await self._queue.cancel(self._tag)
        if self._channel is not None:
            with contextlib.suppress(Exception):
                await self._channel.close()

    async def _on_message(self, message: AbstractIncomingMessage) -> None:
        try:
            contract = decode(message.type, message.body, max_bytes=self._max_bytes)
        except ContractViolation as exc:
            log.warning("dropping a bad reply", extra={"reason": exc.reason, "error": str(exc)})
            return
        try:
            self._listener(contract, message)
        except Exception:
            log.exception("reply listener failed")


@dataclass(frozen=True)
class Expected:
    """What the reply to one step request must be: from that step's agent, about that step,
    action, attempt (fencing token) and idempotency key."""

    sender_role: str
    order_id: str
    step: str
    action: StepAction
    fencing_token: str
    idempotency_key: str

    def mismatch(self, reply: Contract) -> str | None:
        """What of the reply does not answer the request, or None."""
        if not isinstance(reply, StepReply):
            return "not-a-reply"
        for name in ("order_id", "step", "action", "fencing_token", "idempotency_key"):
            if getattr(reply, name) != getattr(self, name):
                return "mismatch"
        return None


class StatusBinder:
    """Binds an application's status queue to `<hub>.status` on its behalf: an application
    reads no exchange (shared/broker/access.py). Called by submission for the `reply_to` of each
    order it takes, once it is sure the queue is the sending application's own; a queue is bound
    again at most every `every_s` (the broker drops a binding with its queue, and a client may
    declare its queue anew). Never raises: an order is recorded whether or not its statuses can
    be delivered."""

    def __init__(
        self,
        connection: AbstractRobustConnection,
        names: Names,
        *,
        every_s: float = 60.0,
        max_known: int = 10_000,
    ) -> None:
        self._connection = connection
        self._names = names
        self._every_s = every_s
        self._max_known = max_known
        self._bound: dict[str, float] = {}
        self._failed: dict[str, float] = {}
        self._channel: AbstractChannel | None = None
        self._lock = asyncio.Lock()

    async def bind(self, queue: str) -> bool:
        loop = asyncio.get_running_loop()
        at = self._bound.get(queue)
        if at is not None and loop.time() - at < self._every_s:
            return True
        failed = self._failed.get(queue)
        if failed is not None and loop.time() - failed < self._every_s:
            return False  # tried lately: a client naming queues that are not there costs once
        async with self._lock:  # a bind that fails closes its channel: one at a time
            try:
                async with asyncio.timeout(BIND_TIMEOUT_S):
                    if self._channel is None or self._channel.is_closed:
                        self._channel = await self._connection.channel()
                    underlay = await self._channel.get_underlay_channel()
                    # It must exist (no queue is made for a name a client merely gives) and
                    # be what a status queue is: declaring it with a status queue's
                    # arguments fails unless it has exactly those, so none that dead-letters
                    # our messages somewhere (into the orders queue, say) is ever bound.
                    await underlay.queue_declare(queue, passive=True)
                    await underlay.queue_declare(queue, **STATUS_QUEUE)
                    await underlay.queue_bind(queue, self._names.status, routing_key=queue)
            except Exception as exc:  # gone, another's exclusive queue, or the broker away
                log.warning(
                    "could not bind a status queue; the order's statuses may not arrive",
                    extra={"reply_to": shown(queue), "error": one_line(exc, 300)},
                )
                if len(self._failed) >= self._max_known:
                    self._failed.clear()
                self._failed[queue] = loop.time()
                return False
        if len(self._bound) >= self._max_known:
            self._bound.clear()
        self._bound[queue] = loop.time()
        return True

    async def close(self) -> None:
        if self._channel is not None:
            with contextlib.suppress(Exception):
                await self._channel.close()


class ReplyRouter:
    """Matches replies to the requests waiting for them: by correlation id (random per request,
    so not guessed), then by sender (the broker-checked user of the step's agent) and content
    (the request's step, action, fencing token and idempotency key). A reply that fails any of
    these is dropped and counted (`orderflow_replies_dropped_total`), and the request goes on
    waiting for its own reply, or its deadline."""

    def __init__(self, senders: Senders | None = None) -> None:
        self._waiting: dict[str, tuple[Expected | None, asyncio.Future[Contract]]] = {}
        self._senders = senders

    def expect(
        self, correlation_id: str, expected: Expected | None = None
    ) -> asyncio.Future[Contract]:
        future: asyncio.Future[Contract] = asyncio.get_running_loop().create_future()
        self._waiting[correlation_id] = (expected, future)
        return future

    def forget(self, correlation_id: str) -> None:
        self._waiting.pop(correlation_id, None)

    def deliver(self, contract: Contract, message: AbstractIncomingMessage) -> None:
        waiting = self._waiting.get(message.correlation_id or "")
        if waiting is None or waiting[1].done():
            REPLIES_DROPPED.labels("unknown").inc()
            log.info(
                "late or unknown reply ignored",
                extra={"correlation_id": shown(message.correlation_id)},
            )
            return
        expected, future = waiting
        if expected is not None:
            why = self._refusal(expected, contract, message)
            if why is not None:
                reason, error = why
                REPLIES_DROPPED.labels(reason).inc()
                log.warning(
                    "reply dropped: it does not answer its request",
                    extra={"reason": reason, "error": error, "order_id": expected.order_id},
                )
                return
            # The reply's arrival, in its order's trace under the agent's publish of it.
            with order_span(
                f"receive {contract.message_type.value}",
                expected.order_id,
                headers=message.headers,
                kind=SpanKind.CONSUMER,
                attributes={"orderflow.step": expected.step},
            ):
                pass
        future.set_result(contract)

    def _refusal(
        self, expected: Expected, contract: Contract, message: AbstractIncomingMessage
    ) -> tuple[str, str] | None:
        user = user_of(message)
        if self._senders is not None:
            unauthorised = self._senders.refusal(user, {expected.sender_role})
            if unauthorised is not None:
                return "unauthorised", unauthorised
        mismatch = expected.mismatch(contract)
        if mismatch is not None:
            return mismatch, f"a {contract.message_type.value} that does not match its request"
        return None
