"""A consumer's side of the inbox: the message ids it claims before handling, marks done after, and
releases when a handling did nothing (the inbox column of the table in shared/broker/consumer.py).

Deliveries handled side by side share their round trips: claims go in one group commit and
completions in another (shared/batching.py), each run without any one delivery's log fields.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from shared.batching import GroupCommit
from shared.broker.delivery import ConsumerPolicy, Delivery, held
from shared.domain.coordination import InboxOutcome
from shared.domain.timing import utcnow
from shared.errors import one_line
from shared.store.port import Inbox, InboxClaim, InboxDone
from shared.telemetry import bind_log_fields

# The consumer's lines, whichever of its modules writes them (as in delivery.py).
log = logging.getLogger("shared.broker.consumer")

R = TypeVar("R")


def inbox_key(delivery: Delivery) -> str:
    """What the inbox dedupes a message by: its id within its sender's (each sender names its
    own messages, so no sender can take another's id first and have its messages dropped as
    duplicates; a replay and a delayed retry keep the original sender, so the key)."""
    if delivery.user_id is None:
        return delivery.message_id
    return f"{delivery.user_id}/{delivery.message_id}"


@dataclass(frozen=True)
class Claim:
    """A message id one delivery holds in the inbox while it is handled."""

    dedupe: InboxDedupe
    key: str
    holder: str

    async def take(self) -> InboxOutcome:
        return await self.dedupe.claim(self.key, self.holder)

    async def done(self) -> None:
        await self.dedupe.mark_done(self.key, self.holder)

    async def release(self) -> None:
        await self.dedupe.release(self.key, self.holder)


class InboxDedupe:
    """The inbox of one input queue, as its consumer uses it."""

    def __init__(self, store: Inbox, queue: str, policy: ConsumerPolicy) -> None:
        self._store = store
        self._queue = queue
        self._policy = policy
        self._claims: GroupCommit[InboxClaim, InboxOutcome] = GroupCommit(
            self._claim_batch, max_batch=policy.prefetch
        )
        self._completions: GroupCommit[InboxDone, None] = GroupCommit(
            self._complete_batch, max_batch=policy.prefetch
        )

    async def claim(self, key: str, holder: str) -> InboxOutcome:
        """Claim the message id; while another delivery holds it, wait for it, `busy_wait` at
        most (a copy handled right now ends sooner; one whose consumer died holds it until its
        claim expires, and the message must not wait for that in hand)."""
        loop = asyncio.get_running_loop()
        give_up = loop.time() + self._policy.busy_wait
        while True:
            claim = InboxClaim(key, holder, utcnow() + self._policy.claim_ttl)
            outcome = await self._claims.submit(claim)
            if outcome is not InboxOutcome.BUSY or loop.time() >= give_up:
                return outcome
            await asyncio.sleep(self._policy.busy_poll)

    async def mark_done(self, key: str, holder: str) -> None:
        """Record the message as handled, retrying only this write through an outage (within
        the patience). Past it the claim expires on its own: a copy that came later could then
        be handled again, which every handler tolerates (the inbox only saves the work)."""
        try:
            await held(
                lambda: self._complete(key, holder),
                patience=self._policy.outage_patience,
                backoff_cap=self._policy.outage_backoff_cap,
            )
        except Exception as exc:
            log.warning(
                "handled, but could not mark it done; its claim will expire",
                extra={"error": one_line(exc)},
            )

    async def release(self, key: str, holder: str) -> None:
        with contextlib.suppress(Exception):
            await self._store.inbox_release(self._queue, key, holder=holder)

    async def _claim_batch(self, claims: Sequence[InboxClaim]) -> list[InboxOutcome]:
        return await self._for_the_batch(
            # Expiry judged allowing for the clock of the consumer that set it.
            self._store.inbox_claim_many(
                self._queue, claims, now=utcnow() - self._policy.clock_skew
            )
        )

    async def _complete(self, key: str, holder: str) -> None:
        keep_until = utcnow() + self._policy.dedupe_window
        await self._completions.submit(InboxDone(key, holder, keep_until))

    async def _complete_batch(self, done: Sequence[InboxDone]) -> list[None]:
        await self._for_the_batch(self._store.inbox_complete_many(self._queue, done))
        return [None] * len(done)

    async def _for_the_batch(self, round_trip: Coroutine[Any, Any, R]) -> R:
        """Run a group commit's round trip without the fields of the delivery whose submit
        happened to start the flusher (its task copied that delivery's context): the batch
        holds many messages, and its lines must not name one of them."""
        context = contextvars.Context()
        context.run(bind_log_fields, queue=self._queue)
        return await asyncio.create_task(round_trip, context=context)
