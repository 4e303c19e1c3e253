"""Consuming with manual acks, MessageId dedupe through the inbox, and dead-letters with reasons.

A handler never touches the channel: it returns, or raises. This adapter maps the outcome:

| outcome                             | message                                   | inbox     |
|-------------------------------------|-------------------------------------------|-----------|
| returned                            | ack                                       | done      |
| `ContractViolation` (or bad body)   | dead-letter with the reason, then ack     | done      |
| any other error, under the limit    | requeue after a backoff                   | released  |
| any other error, at the limit       | dead-letter (`redelivery-limit`), ack     | released  |
| duplicate `message_id`              | ack, handler not called                   | -         |

Every log line written while handling a delivery carries its `message_id`, `message_type` and
`queue`, and once the body is decoded the order it is about (`order_id`, and for step messages
`instance_id` and `step`): the handler's lines included, whoever writes them.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import uuid
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, TypeVar

import aio_pika
from aio_pika.abc import AbstractChannel, AbstractIncomingMessage, AbstractQueue

from shared.batching import GroupCommit
from shared.broker.publisher import Publisher
from shared.broker.topology import Names
from shared.domain.journal import InboxOutcome
from shared.domain.messages import (
    AlertMessage,
    Contract,
    OrderStatusUpdate,
    StepReply,
    StepRequest,
    SubmitOrder,
    decode,
)
from shared.domain.redaction import redact_body
from shared.domain.timing import utcnow
from shared.errors import ContractViolation, PublishError, ServiceUnavailable
from shared.metrics import DEAD_LETTERS, MESSAGES
from shared.store.port import InboxClaim, InboxDone, StateStore
from shared.telemetry import bind_log_fields, log_fields

log = logging.getLogger(__name__)

R = TypeVar("R")

REASON = "x-orderflow-reason"
REDACTED = "x-orderflow-redacted"
"""Set on a dead letter whose body had payment details masked (shared/domain/redaction.py)."""
ERROR = "x-orderflow-error"
SOURCE_QUEUE = "x-orderflow-source-queue"
DEAD_LETTERED_AT = "x-orderflow-dead-lettered-at"
DELIVERIES = "x-orderflow-deliveries"


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
    user, so it cannot be forged)."""


Handler = Callable[[Delivery], Awaitable[None]]
PoisonHook = Callable[[str, str, AbstractIncomingMessage], Awaitable[None]]


@dataclass(frozen=True)
class ConsumerPolicy:
    prefetch: int
    redelivery_limit: int
    max_message_bytes: int
    dedupe_window: timedelta
    claim_ttl: timedelta
    handler_timeout: float
    outage_patience: float = 300.0
    """How long a message is held, retrying, while a server it needs is unavailable."""
    requeue_backoff_cap: float = 5.0
    busy_poll: float = 0.5


@dataclass
class _Stats:
    """This consumer's counts (the process-wide ones are the `orderflow_messages` metrics)."""

    handled: int = 0
    duplicates: int = 0
    dead_lettered: int = 0
    requeued: int = 0
    reasons: dict[str, int] = field(default_factory=dict)


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


def delivery_count(message: AbstractIncomingMessage) -> int:
    """Deliveries so far, this one included (quorum queues count returns in a header)."""
    returned = (message.headers or {}).get("x-delivery-count")
    if isinstance(returned, int):
        return returned + 1
    return 2 if message.redelivered else 1


class Consumer:
    """Consumes one input queue of the hub with one handler."""

    def __init__(
        self,
        *,
        channel: AbstractChannel,
        queue: str,
        names: Names,
        handler: Handler,
        store: StateStore | None,
        dead_letter_publisher: Publisher,
        policy: ConsumerPolicy,
        holder: str,
        on_poison: PoisonHook | None = None,
    ) -> None:
        self._channel = channel
        self._queue_name = queue
        self._names = names
        self._handler = handler
        self._store = store
        self._dead = dead_letter_publisher
        self._policy = policy
        self._holder = holder
        self._on_poison = on_poison
        self._queue: AbstractQueue | None = None
        self._tag: str | None = None
        self._inflight: set[asyncio.Task[None]] = set()
        self.stats = _Stats()
        # Messages handled side by side share their inbox round trips (group commit).
        self._claims: GroupCommit[InboxClaim, InboxOutcome] = GroupCommit(
            self._claim_batch, max_batch=policy.prefetch
        )
        self._completions: GroupCommit[InboxDone, None] = GroupCommit(
            self._complete_batch, max_batch=policy.prefetch
        )

    async def start(self) -> None:
        await self._channel.set_qos(prefetch_count=self._policy.prefetch)
        self._queue = await self._channel.get_queue(self._queue_name, ensure=True)
        self._tag = await self._queue.consume(self._on_message, no_ack=False)

    @property
    def paused(self) -> bool:
        return self._tag is None

    async def pause(self) -> None:
        """Stop taking new messages; the ones in hand finish normally."""
        if self._queue is not None and self._tag is not None:
            await self._queue.cancel(self._tag)
            self._tag = None

    async def resume(self) -> None:
        if self._queue is not None and self._tag is None:
            self._tag = await self._queue.consume(self._on_message, no_ack=False)

    async def stop(self, drain_timeout: float = 10.0) -> None:
        """Stop taking messages, let the ones in hand finish (bounded), cancel the rest."""
        if self._queue is not None and self._tag is not None:
            with contextlib.suppress(Exception):
                await self._queue.cancel(self._tag)
            self._tag = None
        if self._inflight:
            _, pending = await asyncio.wait(self._inflight, timeout=drain_timeout)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)

    def _count(self, outcome: str) -> None:
        MESSAGES.labels(self._queue_name, outcome).inc()

    async def _on_message(self, message: AbstractIncomingMessage) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._inflight.add(task)
        # The block scopes this delivery's fields, and the order fields `_process` binds once
        # the body is decoded (leaving the block restores what was there before both).
        with log_fields(
            message_id=message.message_id, message_type=message.type, queue=self._queue_name
        ):
            try:
                await self._hold_through_outages(message)
            except Exception:
                # Last line of defence: the message goes back, the consumer stays up.
                log.exception("unexpected failure handling a message; requeueing it")
                self._count("requeued")
                with contextlib.suppress(Exception):
                    await message.nack(requeue=True)
            finally:
                if task is not None:
                    self._inflight.discard(task)

    async def _hold_through_outages(self, message: AbstractIncomingMessage) -> None:
        """A store or broker outage is not the message's fault: keep it (unacked, so it is not
        counted as a redelivery) and retry with backoff until the server is back, within the
        patience; past it, requeue."""
        loop = asyncio.get_running_loop()
        give_up = loop.time() + self._policy.outage_patience
        holder = f"{self._holder}:{uuid.uuid4().hex[:8]}"  # this delivery's inbox claims
        delay = 0.1
        while True:
            try:
                await self._process(message, holder)
                return
            except ServiceUnavailable as exc:
                if loop.time() + delay > give_up:
                    self._count("requeued")
                    await message.nack(requeue=True)
                    return
                log.warning(
                    "a server is unavailable; holding the message and retrying",
                    extra={"error": str(exc)},
                )
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)

    async def _process(self, message: AbstractIncomingMessage, holder: str) -> None:
        deliveries = delivery_count(message)
        if not message.message_id:
            await self._dead_letter(message, "missing-message-id", "no message_id property")
            return
        try:
            contract = decode(message.type, message.body, max_bytes=self._policy.max_message_bytes)
        except ContractViolation as exc:
            await self._dead_letter(message, exc.reason, str(exc))
            return
        bind_log_fields(**order_fields(contract))
        if deliveries > self._policy.redelivery_limit:
            await self._dead_letter(
                message, "redelivery-limit", f"delivered {deliveries} times without success"
            )
            return
        delivery = Delivery(
            message=contract,
            message_id=message.message_id,
            correlation_id=message.correlation_id,
            reply_to=message.reply_to,
            headers=dict(message.headers or {}),
            deliveries=deliveries,
            user_id=message.user_id,
        )
        if self._store is None:
            await self._handle(message, delivery, holder=None)
            return
        outcome = await self._claim(message.message_id, holder)
        if outcome is InboxOutcome.DUPLICATE:
            self.stats.duplicates += 1
            self._count("duplicate")
            log.info("duplicate message dropped")
            await message.ack()
        elif outcome is InboxOutcome.BUSY:
            self.stats.requeued += 1
            self._count("requeued")
            await message.nack(requeue=True)
        else:
            await self._handle(message, delivery, holder=holder)

    async def _claim(self, message_id: str, holder: str) -> InboxOutcome:
        """Claim the message id; while another live consumer holds it, wait (bounded) for it."""
        assert self._store is not None
        loop = asyncio.get_running_loop()
        give_up = loop.time() + self._policy.claim_ttl.total_seconds() + 1
        while True:
            claim = InboxClaim(message_id, holder, utcnow() + self._policy.claim_ttl)
            outcome = await self._claims.submit(claim)
            if outcome is not InboxOutcome.BUSY or loop.time() >= give_up:
                return outcome
            await asyncio.sleep(self._policy.busy_poll)

    async def _handle(
        self, message: AbstractIncomingMessage, delivery: Delivery, *, holder: str | None
    ) -> None:
        """`holder` is this delivery's inbox claim, or None when the consumer does not dedupe."""
        try:
            async with asyncio.timeout(self._policy.handler_timeout):
                await self._handler(delivery)
        except ContractViolation as exc:
            dead_lettered = await self._dead_letter(message, exc.reason, str(exc))
            if holder:
                # Once in its DLQ the message is done with; if it could not be put there it
                # was requeued, and the redelivery must find the id free, not a duplicate.
                finish = self._complete if dead_lettered else self._release
                await finish(delivery.message_id, holder)
            return
        except ServiceUnavailable:
            raise  # held and retried by the caller; the claim stays ours (claims are re-entrant)
        except Exception as exc:
            if holder:
                await self._release(delivery.message_id, holder)
            await self._retry_later(message, delivery.deliveries, exc)
            return
        if holder:
            await self._complete(delivery.message_id, holder)
        self.stats.handled += 1
        self._count("handled")
        await message.ack()

    async def _claim_batch(self, claims: Sequence[InboxClaim]) -> list[InboxOutcome]:
        assert self._store is not None
        return await self._for_the_batch(
            self._store.inbox_claim_many(self._queue_name, claims, now=utcnow())
        )

    async def _complete(self, message_id: str, holder: str) -> None:
        keep_until = utcnow() + self._policy.dedupe_window
        await self._completions.submit(InboxDone(message_id, holder, keep_until))

    async def _complete_batch(self, done: Sequence[InboxDone]) -> list[None]:
        assert self._store is not None
        await self._for_the_batch(self._store.inbox_complete_many(self._queue_name, done))
        return [None] * len(done)

    async def _for_the_batch(self, round_trip: Coroutine[Any, Any, R]) -> R:
        """Run a group commit's round trip without the fields of the delivery whose submit
        happened to start the flusher (its task copied that delivery's context): the batch
        holds many messages, and its lines must not name one of them."""
        context = contextvars.Context()
        context.run(bind_log_fields, queue=self._queue_name)
        return await asyncio.create_task(round_trip, context=context)

    async def _release(self, message_id: str, holder: str) -> None:
        assert self._store is not None
        with contextlib.suppress(Exception):
            await self._store.inbox_release(self._queue_name, message_id, holder=holder)

    async def _retry_later(
        self, message: AbstractIncomingMessage, deliveries: int, exc: Exception
    ) -> None:
        if deliveries >= self._policy.redelivery_limit:
            await self._dead_letter(message, "redelivery-limit", f"last error: {exc!r}")
            return
        log.warning(
            "handler failed; requeueing", extra={"deliveries": deliveries, "error": repr(exc)}
        )
        self.stats.requeued += 1
        self._count("requeued")
        await asyncio.sleep(min(self._policy.requeue_backoff_cap, 0.05 * 2**deliveries))
        await message.nack(requeue=True)

    async def _dead_letter(self, message: AbstractIncomingMessage, reason: str, error: str) -> bool:
        """Copy the message to its dead-letter queue with the reason, then ack the original;
        False when the copy could not be published and the original was requeued instead."""
        headers = dict(message.headers or {})
        headers |= {
            REASON: reason,
            ERROR: error[:1000],
            SOURCE_QUEUE: self._queue_name,
            DEAD_LETTERED_AT: utcnow().isoformat(),
            DELIVERIES: delivery_count(message),
        }
        # Whatever a sender put in a refused message must not sit in the DLQ in clear.
        body, redacted = redact_body(message.body)
        if redacted:
            headers[REDACTED] = True
        copy = aio_pika.Message(
            body,
            headers=headers,
            message_id=message.message_id,
            correlation_id=message.correlation_id,
            reply_to=message.reply_to,
            type=message.type,
            content_type=message.content_type,
            delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
        )
        try:
            await self._dead.publish_raw(
                copy, exchange=self._names.dead_letters, routing_key=self._queue_name
            )
        except PublishError:
            log.exception("could not dead-letter a message; requeueing it instead")
            self._count("requeued")
            await message.nack(requeue=True)
            return False
        self.stats.dead_lettered += 1
        self.stats.reasons[reason] = self.stats.reasons.get(reason, 0) + 1
        self._count("dead_lettered")
        DEAD_LETTERS.labels(self._queue_name, reason).inc()
        log.warning("message dead-lettered", extra={"reason": reason, "error": error[:200]})
        await message.ack()
        if self._on_poison is not None:
            with contextlib.suppress(Exception):
                await self._on_poison(reason, error, message)
        return True
