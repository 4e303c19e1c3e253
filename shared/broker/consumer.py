"""Consuming with manual acks, MessageId dedupe through the inbox, and dead-letters with reasons.

A handler never touches the channel: it returns, or raises. This adapter alone maps the outcome,
and every exception lands in a row of this table:

| outcome                                   | message                                  | inbox    |
|-------------------------------------------|------------------------------------------|----------|
| returned                                  | ack                                      | done     |
| duplicate `message_id`                    | ack, handler not called                  | -        |
| no or unusable `message_id`, a bad body,  | dead-lettered at its first delivery with | released |
| a `ContractViolation`, any other          | its reason and the error; poison alert   |          |
| `PermanentError` (`StoreRefused`: data    |                                          |          |
| the store cannot hold)                    |                                          |          |
| a known outage (`ServiceUnavailable`:     | held: retried in place with backoff and  | kept     |
| store or broker unreachable;              | jitter for `outage_patience`, then       |          |
| `PublishError`, the dead letter's or the  | requeued                                 |          |
| retry copy's own publish included)        |                                          |          |
| any other exception, delayed retries left | set aside: a copy to `<queue>.retry`,    | released |
|                                           | back after `retry_delay`; original acked |          |
| any other exception, no retries left      | dead-lettered (`retries-exhausted`)      | released |
| delivered over `redelivery_limit` times   | dead-lettered (`redelivery-limit`)       | -        |

So a message that fails the same way every time costs one handling and never comes back, one
that may pass later is out of the way while it waits (NServiceBus's delayed retries), and only
an outage, which stops every message alike, holds one. No message delays those behind it by more
than one handling.

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
from collections.abc import Coroutine, Sequence
from typing import Any, TypeVar

import aiormq
from aio_pika.abc import AbstractChannel, AbstractIncomingMessage, AbstractQueue

from shared import clock
from shared.batching import GroupCommit
from shared.broker.delivery import (
    ConsumerPolicy,
    Delivery,
    Handler,
    PoisonHook,
    delivery_count,
    held,
    intake_state,
    is_outage,
    order_fields,
    reason_of,
)
from shared.broker.detours import Detours, Stats
from shared.broker.envelope import (
    DEAD_LETTERED_AT,
    DELIVERIES,
    ERROR,
    REASON,
    REDACTED,
    RETRIES,
    SEAL,
    SOURCE_QUEUE,
    Envelope,
    shown,
)
from shared.broker.publisher import Publishing
from shared.broker.senders import Senders, queue_role, queue_senders
from shared.broker.topology import Names
from shared.domain.coordination import InboxOutcome
from shared.domain.messages import decode
from shared.domain.timing import utcnow
from shared.errors import (
    ConfigurationError,
    ContractViolation,
    PermanentError,
    PublishError,
    ServiceUnavailable,
    one_line,
)
from shared.store.port import Inbox, InboxClaim, InboxDone
from shared.telemetry import bind_log_fields, log_fields

log = logging.getLogger(__name__)

R = TypeVar("R")

__all__ = [
    "DEAD_LETTERED_AT",
    "DELIVERIES",
    "ERROR",
    "REASON",
    "REDACTED",
    "RETRIES",
    "SOURCE_QUEUE",
    "Consumer",
    "ConsumerPolicy",
    "Delivery",
    "Handler",
    "PoisonHook",
]


def inbox_key(delivery: Delivery) -> str:
    """What the inbox dedupes a message by: its id within its sender's (each sender names its
    own messages, so no sender can take another's id first and have its messages dropped as
    duplicates; a replay and a delayed retry keep the original sender, so the key)."""
    if delivery.user_id is None:
        return delivery.message_id
    return f"{delivery.user_id}/{delivery.message_id}"


class Consumer:
    """Consumes one input queue of the hub with one handler."""

    def __init__(
        self,
        *,
        channel: AbstractChannel,
        queue: str,
        names: Names,
        handler: Handler,
        store: Inbox | None,
        dead_letter_publisher: Publishing,
        policy: ConsumerPolicy,
        holder: str,
        on_poison: PoisonHook | None = None,
    ) -> None:
        self._channel = channel
        self._queue_name = queue
        self._names = names
        self._handler = handler
        self._store = store
        self._policy = policy
        self._holder = holder
        self._queue: AbstractQueue | None = None
        self._tag: str | None = None
        self._inflight: set[asyncio.Task[None]] = set()
        self.stats = Stats()
        self._senders = Senders.of(
            names.hub, policy.user_prefix, policy.own_user, queue_role(names, queue)
        )
        self._allowed = queue_senders(names, queue)
        self._detours = Detours(
            queue=queue,
            names=names,
            publisher=dead_letter_publisher,
            policy=policy,
            stats=self.stats,
            on_poison=on_poison,
        )
        self.last_taken: float | None = None
        """`clock.monotonic()` of the last delivery taken (None: none yet)."""
        self.subscribed_at: float | None = None
        # Messages handled side by side share their inbox round trips (group commit).
        self._claims: GroupCommit[InboxClaim, InboxOutcome] = GroupCommit(
            self._claim_batch, max_batch=policy.prefetch
        )
        self._completions: GroupCommit[InboxDone, None] = GroupCommit(
            self._complete_batch, max_batch=policy.prefetch
        )

    @property
    def queue(self) -> str:
        return self._queue_name

    async def start(self) -> None:
        await self._channel.set_qos(prefetch_count=self._policy.prefetch)
        self._queue = await self._channel.get_queue(self._queue_name, ensure=True)
        for exchange in (self._names.retry(self._queue_name), self._names.dlq(self._queue_name)):
            try:
                await self._channel.get_exchange(exchange, ensure=True)
            except aiormq.exceptions.ChannelNotFoundEntity:
                # Setting a message aside or dead-lettering it would close the shared
                # publisher's channel, every time.
                raise ConfigurationError(
                    f"exchange {exchange} does not exist: run `orderflow init` (this release "
                    "adds it) and load the RabbitMQ definitions again"
                ) from None
        await self._subscribe()

    async def _subscribe(self) -> None:
        assert self._queue is not None
        self._tag = await self._queue.consume(self._on_message, no_ack=False)
        self.subscribed_at = clock.monotonic()

    @property
    def paused(self) -> bool:
        return self._tag is None

    @property
    def in_hand(self) -> int:
        """Deliveries being handled right now."""
        return len(self._inflight)

    async def subscribed(self) -> bool:
        """Whether the broker still delivers to this consumer: it has not been paused, and its
        channel is open and still knows the consumer (the broker may cancel one, e.g. when
        its queue is deleted, and a channel closed by an error drops them all)."""
        if self._tag is None or self._channel.is_closed:
            return False
        try:
            underlay = await self._channel.get_underlay_channel()
        except Exception:  # no underlying channel: reconnecting
            return False
        consumers = getattr(underlay, "consumers", None)  # aiormq's Channel has it
        return consumers is None or self._tag in consumers

    async def intake(self, *, ready: int | None, stall_after_s: float) -> dict[str, Any]:
        """This consumer's intake, for the heartbeat, `/healthz` and `orderflow stats`; `ready`
        is its queue's depth, read by the caller on a channel of its own (a passive declare of
        a queue that is gone closes the channel it runs on, and must not close this one's)."""
        since = self.last_taken or self.subscribed_at
        idle_s = clock.monotonic() - since if since is not None else 0.0
        state = intake_state(
            started=self._queue is not None,
            paused=self._tag is None,
            subscribed=await self.subscribed(),
            ready=ready,
            idle_s=idle_s,
            stall_after_s=stall_after_s,
        )
        return {
            "queue": self._queue_name,
            "state": state,
            "ready": ready,
            "in_hand": len(self._inflight),
            "idle_s": round(idle_s, 1),
        }

    async def pause(self) -> None:
        """Stop taking new messages; the ones in hand finish normally."""
        if self._queue is not None and self._tag is not None:
            await self._queue.cancel(self._tag)
            self._tag = None

    async def resume(self) -> None:
        if self._queue is not None and self._tag is None:
            await self._subscribe()

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

    async def _on_message(self, message: AbstractIncomingMessage) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._inflight.add(task)
        self.last_taken = clock.monotonic()
        envelope = Envelope.of(message)
        # The block scopes this delivery's fields, and the order fields `_process` binds once
        # the body is decoded (leaving the block restores what was there before both).
        with log_fields(
            message_id=envelope.message_id or shown(envelope.raw_message_id),
            message_type=envelope.type,
            queue=self._queue_name,
        ):
            try:
                await self._hold_through_outages(message, envelope)
            except Exception:
                # Last line of defence: a failure of this adapter itself (an ack on a channel
                # that died). The redelivery limit, checked before any handling, bounds the
                # requeues; the consumer stays up.
                log.exception("unexpected failure handling a message; requeueing it")
                with contextlib.suppress(Exception):
                    await self._detours.requeue(message, counted=True)
            finally:
                if task is not None:
                    self._inflight.discard(task)

    async def _hold_through_outages(
        self, message: AbstractIncomingMessage, envelope: Envelope
    ) -> None:
        """A store or broker outage is not the message's fault: keep it (unacked, so it is not
        counted as a redelivery) and retry with backoff and jitter until the server is back,
        within the patience; past it, return it to its queue without counting a delivery (so
        no outage, however long, can dead-letter it)."""
        holder = f"{self._holder}:{uuid.uuid4().hex[:8]}"  # this delivery's inbox claims
        try:
            await held(
                lambda: self._process(message, envelope, holder),
                patience=self._policy.outage_patience,
                backoff_cap=self._policy.outage_backoff_cap,
            )
        except (ServiceUnavailable, PublishError) as exc:
            if not is_outage(exc):
                raise
            sender, _ = self._authorise(message, envelope)
            await self._detours.return_held(
                message, envelope, sender, f"{type(exc).__name__}: {one_line(exc, 900)}"
            )

    async def _process(
        self, message: AbstractIncomingMessage, envelope: Envelope, holder: str
    ) -> None:
        refused = envelope.refusal()
        if refused is not None:
            await self._detours.dead_letter(message, envelope, *refused)
            return
        assert envelope.message_id is not None
        sender, unauthorised = self._authorise(message, envelope)
        if unauthorised is not None:
            await self._detours.dead_letter(
                message, envelope, "unauthorised", unauthorised, sender=sender
            )
            return
        deliveries = delivery_count(message, envelope.deliveries_before(self._policy.own_user))
        try:
            contract = decode(envelope.type, message.body, max_bytes=self._policy.max_message_bytes)
        except ContractViolation as exc:
            await self._detours.dead_letter(message, envelope, exc.reason, str(exc), sender=sender)
            return
        bind_log_fields(**order_fields(contract))
        if deliveries > self._policy.redelivery_limit:
            await self._detours.dead_letter(
                message,
                envelope,
                "redelivery-limit",
                f"delivered {deliveries} times",
                sender=sender,
            )
            return
        delivery = Delivery(
            message=contract,
            message_id=envelope.message_id,
            correlation_id=envelope.correlation_id,
            reply_to=envelope.reply_to,
            headers=envelope.headers,
            deliveries=deliveries,
            user_id=sender,
            retries=envelope.retries(self._policy.delayed_retries),
        )
        if self._store is None:
            await self._handle(message, envelope, delivery, holder=None)
        else:
            await self._dedupe(message, envelope, delivery, holder)

    def _authorise(
        self, message: AbstractIncomingMessage, envelope: Envelope
    ) -> tuple[str | None, str | None]:
        """(the sender, why it may not send here or None). The sender is the broker-checked
        `user_id`; a copy back from our retry queue says whose it was, and a replayed dead
        letter's seal does (whoever replays it: only this queue's consumer could make it)."""
        sender = envelope.sender(self._policy.own_user)
        if SEAL in envelope.headers:
            replayer = self._senders.role_of(envelope.user_id)
            publisher = envelope.user_id
            if replayer != "operator" and publisher != self._policy.own_user:
                return sender, (
                    f"a sealed dead letter sent by user {publisher!r} ({replayer}): only the "
                    "operator replays dead letters"
                )
            sealed = envelope.sealed_sender(self._queue_name, message.body, self._policy.seal_key)
            if sealed is None:
                return sender, (
                    f"sent by user {sender!r} with a seal that does not check: not a dead letter "
                    f"of {self._queue_name} as its consumer made it (or one sealed under another "
                    "key: see ORDERFLOW_SEAL_KEY)"
                )
            sender = sealed
        return sender, self._senders.refusal(sender, self._allowed)

    async def _dedupe(
        self,
        message: AbstractIncomingMessage,
        envelope: Envelope,
        delivery: Delivery,
        holder: str,
    ) -> None:
        """Handle the message unless the inbox has its id already (or another consumer does)."""
        try:
            outcome = await self._claim(inbox_key(delivery), holder)
        except PermanentError as exc:  # the store refuses this message id
            await self._detours.dead_letter(
                message, envelope, reason_of(exc), one_line(exc, 1000), sender=delivery.user_id
            )
            return
        except Exception as exc:
            if is_outage(exc):
                raise
            await self._detours.set_aside(message, envelope, delivery, exc)
            return
        if outcome is InboxOutcome.DUPLICATE:
            self.stats.duplicates += 1
            self._detours.count("duplicate")
            log.info("duplicate message dropped")
            await message.ack()
        elif outcome is InboxOutcome.BUSY:
            await self._detours.requeue(message)
        else:
            await self._handle(message, envelope, delivery, holder=holder)

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
        self,
        message: AbstractIncomingMessage,
        envelope: Envelope,
        delivery: Delivery,
        *,
        holder: str | None,
    ) -> None:
        """`holder` is this delivery's inbox claim, or None when the consumer does not dedupe."""
        try:
            async with asyncio.timeout(self._policy.handler_timeout):
                await self._handler(delivery)
        except PermanentError as exc:
            # It will fail the same way again: to its DLQ at once, with its own reason. The
            # claim is released either way: a replay from the DLQ (the cause fixed) must be
            # handled, not dropped as a duplicate of a delivery that did nothing.
            text = str(exc) if isinstance(exc, ContractViolation) else one_line(exc, 1000)
            await self._detours.dead_letter(
                message, envelope, reason_of(exc), text, sender=delivery.user_id
            )
            if holder:
                await self._release(inbox_key(delivery), holder)
            return
        except Exception as exc:
            if is_outage(exc):
                raise  # held and retried by the caller; the claim stays ours (re-entrant)
            if holder:
                await self._release(inbox_key(delivery), holder)
            await self._detours.set_aside(message, envelope, delivery, exc)
            return
        # Done: from here on nothing may run the handler again, whatever fails.
        if holder:
            await self._mark_done(inbox_key(delivery), holder)
        self.stats.handled += 1
        self._detours.count("handled")
        await message.ack()

    async def _mark_done(self, message_id: str, holder: str) -> None:
        """Record the message as handled, retrying only this write through an outage (within
        the patience). Past it the claim expires on its own: a copy that came later could then
        be handled again, which every handler tolerates (the inbox only saves the work)."""
        try:
            await held(
                lambda: self._complete(message_id, holder),
                patience=self._policy.outage_patience,
                backoff_cap=self._policy.outage_backoff_cap,
            )
        except Exception as exc:
            log.warning(
                "handled, but could not mark it done; its claim will expire",
                extra={"error": one_line(exc)},
            )

    async def _claim_batch(self, claims: Sequence[InboxClaim]) -> list[InboxOutcome]:
        assert self._store is not None
        return await self._for_the_batch(
            # Expiry judged allowing for the clock of the consumer that set it.
            self._store.inbox_claim_many(
                self._queue_name, claims, now=utcnow() - self._policy.clock_skew
            )
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
