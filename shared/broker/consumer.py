"""Consuming with manual acks, MessageId dedupe through the inbox, and dead-letters with reasons.

A handler never touches the channel: it returns, or raises. This adapter alone maps the outcome,
and every exception lands in a row of this table:

| outcome                                   | message                                  | inbox    |
|-------------------------------------------|------------------------------------------|----------|
| returned                                  | ack                                      | done     |
| duplicate `message_id`                    | ack, handler not called                  | -        |
| its `message_id` claimed by another       | waits `busy_wait` in hand, then returned | -        |
| delivery (a copy handled now, or one      | uncounted: a copy to `<queue>.retry`,    |          |
| whose consumer died, until its claim      | back after `retry_delay`; original acked |          |
| expires)                                  |                                          |          |
| no or unusable `message_id`, a bad body,  | dead-lettered at its first delivery with | released |
| a `ContractViolation`, any other          | its reason and the error; poison alert   |          |
| `PermanentError` (`StoreRefused`: data    |                                          |          |
| the store cannot hold)                    |                                          |          |
| a known outage (`ServiceUnavailable`:     | held: retried in place with backoff and  | kept     |
| store or broker unreachable;              | jitter for `outage_patience`, then       |          |
| `PublishError`, the dead letter's or the  | returned uncounted, as above             |          |
| retry copy's own publish included)        |                                          |          |
| any other exception, delayed retries left | set aside: a copy to `<queue>.retry`,    | released |
|                                           | back after `retry_delay`; original acked |          |
| any other exception, no retries left      | dead-lettered (`retries-exhausted`)      | released |
| delivered over `redelivery_limit` times   | dead-lettered (`redelivery-limit`)       | -        |
| a first delivery with headers only the    | uncounted: a clean copy to               | -        |
| broker writes (`x-delivery-count`,        | `<queue>.retry`, back at once; original  |          |
| `x-death`, ...), its sender's             | acked                                    |          |

Where each row is done:
- `Consumer._process`: the refusals before any handling (no usable `message_id`, a body no
  contract accepts, a sender that may not send here), the headers a sender may not set, and
  the `redelivery_limit`;
- `Consumer._dedupe`: a duplicate, an id another delivery holds, and a failure of the inbox
  claim itself;
- `Consumer._handle`: whatever the handler returned or raised;
- `Consumer._hold_through_outages`: an outage, whichever of them met it.
The acks of handlings that returned side by side go out together (shared/broker/acks.py).
The copies a message leaves by (a dead letter; a retry copy, or a dead letter once no retries
are left; a held message's return) are made by shared/broker/detours.py, and the inbox column is
kept by shared/broker/dedupe.py. The deliveries come through the subscription of
shared/broker/subscription.py (pause, resume, drain, intake).

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
import dataclasses
import logging
import uuid
from collections.abc import Callable, Sequence

from opentelemetry.trace import SpanKind

from shared.broker.acks import Acks
from shared.broker.dedupe import AlongClaim, Claim, InboxDedupe, inbox_key
from shared.broker.delivery import (
    ConsumerPolicy,
    Delivery,
    Handler,
    PoisonHook,
    delivery_count,
    held,
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
from shared.broker.port import Connection, Incoming
from shared.broker.publisher import Publishing
from shared.broker.senders import REPLAYERS, Senders, queue_role, queue_senders
from shared.broker.subscription import Subscription
from shared.broker.topology import Names
from shared.domain.coordination import InboxOutcome
from shared.domain.messages import Contract, SubmitOrder, decode
from shared.errors import (
    ContractViolation,
    PermanentError,
    PublishError,
    ServiceUnavailable,
    one_line,
)
from shared.store.port import Inbox
from shared.telemetry import bind_log_fields, log_fields
from shared.tracing import failed, order_span

log = logging.getLogger(__name__)

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


class Consumer(Subscription):
    """Consumes one input queue of the hub with one handler."""

    def __init__(
        self,
        *,
        connection: Connection,
        queue: str,
        names: Names,
        handler: Handler,
        store: Inbox | None,
        dead_letter_publisher: Publishing,
        policy: ConsumerPolicy,
        holder: str,
        on_poison: PoisonHook | None = None,
        along: Callable[[Delivery], Sequence[AlongClaim]] | None = None,
    ) -> None:
        """`along`: the claims a delivery's handler will make first, to be made with the
        delivery's own inbox claim, in the same round trip
        (decision:first-attempt-ticket-with-inbox-claim)."""
        super().__init__(connection=connection, queue=queue, names=names, prefetch=policy.prefetch)
        self._handler = handler
        self._policy = policy
        self._holder = holder
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
        # Messages handled side by side share their inbox round trips (group commit).
        self._inbox = None if store is None else InboxDedupe(store, queue, policy)
        self._acks = Acks()
        self._along = along

    async def _deliver(self, message: Incoming) -> None:
        self._acks.taken(message)
        try:
            await self._process_delivery(message)
        finally:
            self._acks.left(message)

    async def _process_delivery(self, message: Incoming) -> None:
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

    async def _hold_through_outages(self, message: Incoming, envelope: Envelope) -> None:
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

    async def _process(self, message: Incoming, envelope: Envelope, holder: str) -> None:
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
        forged = envelope.set_by_sender(self._policy.own_user, bool(message.redelivered))
        if forged:
            await self._detours.return_clean(message, envelope, sender, forged)
            return
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
            retries=envelope.retries(self._policy.delayed_retries, self._policy.own_user),
        )
        with self._span(contract, envelope, deliveries):
            if self._inbox is None:
                await self._handle(message, envelope, delivery, claim=None)
            else:
                along = self._along(delivery) if self._along is not None else ()
                await self._dedupe(
                    message,
                    envelope,
                    delivery,
                    Claim(self._inbox, inbox_key(delivery), holder, along),
                )

    def _span(
        self, contract: Contract, envelope: Envelope, deliveries: int
    ) -> contextlib.AbstractContextManager[object]:
        """The handling's span in its order's trace (shared/tracing.py). An order's submission
        is not traced here: its system order id, which names the trace, is the submission
        process's to decide (services/submission), and its span is the trace's root."""
        order_id = order_fields(contract).get("order_id")
        if order_id is None or isinstance(contract, SubmitOrder):
            return contextlib.nullcontext()
        return order_span(
            f"handle {envelope.type}",
            order_id,
            headers=envelope.headers,
            kind=SpanKind.CONSUMER,
            attributes={
                "messaging.system": "rabbitmq",
                "messaging.destination.name": self._queue_name,
                "messaging.message.id": envelope.message_id or "",
                "orderflow.deliveries": deliveries,
            },
        )

    def _authorise(self, message: Incoming, envelope: Envelope) -> tuple[str | None, str | None]:
        """(the sender, why it may not send here or None). The sender is the broker-checked
        `user_id`; a copy back from our retry queue says whose it was, and a replayed dead
        letter's seal does (whoever replays it: only this queue's consumer could make it)."""
        sender = envelope.sender(self._policy.own_user)
        if SEAL in envelope.headers:
            replayer = self._senders.role_of(envelope.user_id)
            publisher = envelope.user_id
            if replayer not in REPLAYERS and publisher != self._policy.own_user:
                return sender, (
                    f"a sealed dead letter sent by user {publisher!r} ({replayer}): only the "
                    "operator replays dead letters (itself, or through the API)"
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
        message: Incoming,
        envelope: Envelope,
        delivery: Delivery,
        claim: Claim,
    ) -> None:
        """Handle the message unless the inbox has its id already (or another consumer does)."""
        try:
            outcome, taken = await claim.take()
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
            await self._acks.ack(message)  # a redelivered burst's duplicates go together
        elif outcome is InboxOutcome.BUSY:
            # Another delivery holds its id (a copy handled right now, or one whose consumer
            # died, until its claim expires): the message waits out of hand, uncounted.
            await self._detours.return_held(
                message,
                envelope,
                delivery.user_id,
                f"its message id is claimed by another delivery for {self._policy.busy_wait}s",
                waiting_for="another delivery's claim",
            )
        else:
            delivery = dataclasses.replace(delivery, taken_along=taken)
            await self._handle(message, envelope, delivery, claim=claim)

    async def _handle(
        self,
        message: Incoming,
        envelope: Envelope,
        delivery: Delivery,
        *,
        claim: Claim | None,
    ) -> None:
        """`claim` is this delivery's in the inbox, or None when the consumer does not dedupe."""
        try:
            async with asyncio.timeout(self._policy.handler_timeout):
                await self._handler(delivery)
        except PermanentError as exc:
            failed(exc)
            # It will fail the same way again: to its DLQ at once, with its own reason. The
            # claim is released either way: a replay from the DLQ (the cause fixed) must be
            # handled, not dropped as a duplicate of a delivery that did nothing.
            text = str(exc) if isinstance(exc, ContractViolation) else one_line(exc, 1000)
            await self._detours.dead_letter(
                message, envelope, reason_of(exc), text, sender=delivery.user_id
            )
            if claim is not None:
                await claim.release()
            return
        except Exception as exc:
            if is_outage(exc):
                raise  # held and retried by the caller; the claim stays ours (re-entrant)
            failed(exc)
            if claim is not None:
                await claim.release()
            await self._detours.set_aside(message, envelope, delivery, exc)
            return
        # Done: from here on nothing may run the handler again, whatever fails.
        if claim is not None:
            await claim.done()
        self.stats.handled += 1
        self._detours.count("handled")
        await self._acks.ack(message)
