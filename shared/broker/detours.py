"""The two ways a message leaves its queue other than by being handled: to its dead-letter queue
(it will fail the same way again), or aside into its retry queue (it may pass later). Either
way a copy is published with confirms first, and only then is the original acknowledged; a
copy the broker does not take leaves the original requeued, never lost.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass, field

from shared.broker.delivery import (
    ConsumerPolicy,
    Delivery,
    PoisonHook,
    delivery_count,
    held,
)
from shared.broker.envelope import Envelope, dead_letter_copy, retry_copy, shown
from shared.broker.port import Incoming, Outgoing
from shared.broker.publisher import Publishing
from shared.broker.topology import Names
from shared.domain.redaction import redact_text
from shared.domain.text import cut, printable, shown_cut
from shared.errors import PublishError, one_line
from shared.metrics import DEAD_LETTERS, MESSAGES

log = logging.getLogger(__name__)


@dataclass
class Stats:
    """One consumer's counts (the process-wide ones are the `orderflow_messages` metrics)."""

    handled: int = 0
    duplicates: int = 0
    dead_lettered: int = 0
    requeued: int = 0
    set_aside: int = 0
    held_returns: int = 0
    """Messages held through an outage past the patience and returned to their queue."""
    cleaned: int = 0
    """Messages whose sender set headers only the broker writes, returned as clean copies."""
    reasons: dict[str, int] = field(default_factory=dict)


class Detours:
    """Dead-letters and sets aside the messages of one input queue."""

    def __init__(
        self,
        *,
        queue: str,
        names: Names,
        publisher: Publishing,
        policy: ConsumerPolicy,
        stats: Stats,
        on_poison: PoisonHook | None,
    ) -> None:
        self._queue = queue
        self._names = names
        self._publisher = publisher
        self._policy = policy
        self._stats = stats
        self._on_poison = on_poison

    async def _publish(self, copy: Outgoing, exchange: str, what: str) -> bool:
        """Publish a copy, holding it through a broker outage like any message (backoff and
        jitter, within the patience); False when the broker still did not take it."""
        try:
            await held(
                lambda: self._publisher.publish_raw(
                    copy, exchange=exchange, routing_key=self._queue
                ),
                patience=self._policy.outage_patience,
                backoff_cap=self._policy.outage_backoff_cap,
            )
        except PublishError:
            log.exception(f"could not {what} a message; requeueing it instead")
            return False
        return True

    def count(self, outcome: str) -> None:
        MESSAGES.labels(self._queue, outcome).inc()

    async def requeue(self, message: Incoming, *, counted: bool = False) -> None:
        """Back to the head of its queue. `counted`: the delivery failed and counts towards the
        redelivery limits (ours and the quorum queue's), so `basic.reject`; else `basic.nack`,
        which from RabbitMQ 4.3 on does not count (before it, both count)."""
        self._stats.requeued += 1
        self.count("requeued")
        if counted:
            await message.reject(requeue=True)
        else:
            await message.nack(requeue=True)

    async def return_held(
        self,
        message: Incoming,
        envelope: Envelope,
        sender: str | None,
        error: str,
        *,
        waiting_for: str = "a server",
    ) -> None:
        """A message that has waited in hand for something not its own doing (a server in an
        outage, past the patience; another delivery's claim on its id) goes back to its queue
        without counting a delivery: a copy that carries the deliveries counted so far waits
        `retry_delay` in the retry queue (its retries unchanged), then the original is acked.
        Held, it would count one each time its process died or the broker restarted (every
        return counts before RabbitMQ 4.3). While the broker takes no copy either, it is
        requeued."""
        own = self._policy.own_user
        copy = retry_copy(
            message,
            envelope,
            retries=envelope.retries(self._policy.delayed_retries, own),
            delay_s=self._policy.retry_delay,
            error=error,
            own_user=own,
            sender=sender,
            deliveries=delivery_count(message, envelope.deliveries_before(own)) - 1,
        )
        try:
            await self._publisher.publish_raw(
                copy, exchange=self._names.retry(self._queue), routing_key=self._queue
            )
        except PublishError:
            await self.requeue(message)
            return
        log.warning(
            f"still waiting for {waiting_for}; message returned to its queue, its deliveries "
            "not counted",
            extra={"delay_s": self._policy.retry_delay, "error": shown_cut(error, 300)},
        )
        self._stats.held_returns += 1
        self.count("held_return")
        await message.ack()

    async def return_clean(
        self,
        message: Incoming,
        envelope: Envelope,
        sender: str | None,
        forged: list[str],
    ) -> None:
        """A first delivery that carries headers only the broker writes (`forged`, set by its
        sender) goes back to its queue as a clean copy of ours, at once and uncounted: through
        the retry queue without delay, the sender kept, those headers dropped, its delayed
        retries none; then the original is acked. Returned any other way it could be
        redelivered still carrying them: from RabbitMQ 4.3 a `basic.nack` returns a message
        without counting it (a closed channel counts, like a crash), and the broker then leaves
        a sender's `x-delivery-count` in place. While the broker takes no copy (past the
        patience), the original is rejected instead: a counted return, whose count the broker
        writes over the sender's on every version."""
        own = self._policy.own_user
        names = redact_text(", ".join(forged))  # a header's name is the sender's text too
        copy = retry_copy(
            message,
            envelope,
            retries=0,
            delay_s=0,
            error=f"sent with headers only the broker writes: {names}",
            own_user=own,
            sender=sender,
            deliveries=delivery_count(message, envelope.deliveries_before(own)) - 1,
        )
        if not await self._publish(copy, self._names.retry(self._queue), "return a clean copy of"):
            await self.requeue(message, counted=True)
            return
        log.warning(
            "a first delivery carried headers only the broker writes; returned to its queue "
            "as a clean copy",
            extra={"headers": cut(printable(names), 300)},
        )
        self._stats.cleaned += 1
        self.count("cleaned")
        await message.ack()

    async def dead_letter(
        self,
        message: Incoming,
        envelope: Envelope,
        reason: str,
        error: str,
        *,
        sender: str | None = None,
    ) -> bool:
        """Copy the message to its dead-letter queue with the reason and its sealed sender, then
        ack the original; False when the copy could not be published and the original was
        requeued instead."""
        copy = dead_letter_copy(
            message,
            envelope,
            reason=reason,
            error=error,
            queue=self._queue,
            deliveries=delivery_count(message, envelope.deliveries_before(self._policy.own_user)),
            max_body=self._policy.max_message_bytes,
            sender=sender,
            seal_key=self._policy.seal_key,
            own_user=self._policy.own_user,
        )
        if not await self._publish(copy, self._names.dlq(self._queue), "dead-letter"):
            await self.requeue(message)
            return False
        self._stats.dead_lettered += 1
        self._stats.reasons[reason] = self._stats.reasons.get(reason, 0) + 1
        self.count("dead_lettered")
        DEAD_LETTERS.labels(self._queue, reason).inc()
        log.warning(
            "message dead-lettered",
            extra={"reason": reason, "error": cut(printable(redact_text(error)), 300)},
        )
        await message.ack()
        if self._on_poison is not None:
            message_id = envelope.message_id or shown(envelope.raw_message_id)
            with contextlib.suppress(Exception):
                await self._on_poison(reason, error, message_id)
        return True

    async def set_aside(
        self,
        message: Incoming,
        envelope: Envelope,
        delivery: Delivery,
        exc: Exception,
    ) -> None:
        """An unexpected failure may pass later: the message waits in the retry queue, out of
        the way of the ones behind it, and comes back after the delay; past the delayed
        retries it goes to its DLQ with the last error."""
        error = f"{type(exc).__name__}: {one_line(exc, 900)}"
        if delivery.retries >= self._policy.delayed_retries:
            await self.dead_letter(
                message,
                envelope,
                "retries-exhausted",
                f"failed after {delivery.retries} delayed retries; last error {error}",
                sender=delivery.user_id,
            )
            return
        copy = retry_copy(
            message,
            envelope,
            retries=delivery.retries + 1,
            delay_s=self._policy.retry_delay,
            error=error,
            own_user=self._policy.own_user,
            sender=delivery.user_id,
        )
        if not await self._publish(copy, self._names.retry(self._queue), "set aside"):
            await self.requeue(message)
            return
        log.warning(
            "handler failed; message set aside for a delayed retry",
            extra={
                "retry": delivery.retries + 1,
                "delay_s": self._policy.retry_delay,
                "error": shown_cut(error, 300),
            },
        )
        self._stats.set_aside += 1
        self.count("set_aside")
        await message.ack()
