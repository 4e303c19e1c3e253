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
from datetime import datetime
from typing import Any, NamedTuple, TypeVar

from shared.batching import GroupCommit
from shared.broker.delivery import ConsumerPolicy, Delivery, TakenAlong, held
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


class AlongClaim(NamedTuple):
    """A claim made along with a delivery's own (decision:first-attempt-ticket-with-inbox-claim)."""

    queue: str
    """The inbox queue it is in."""
    claim: InboxClaim


_Asked = tuple[InboxClaim, Sequence[AlongClaim]]
"""A delivery's claim, and the claims made along with it."""


@dataclass(frozen=True)
class Claim:
    """A message id one delivery holds in the inbox while it is handled."""

    dedupe: InboxDedupe
    key: str
    holder: str
    along: Sequence[AlongClaim] = ()
    """Claims the handler will make first, made now in the same round trip
    (decision:first-attempt-ticket-with-inbox-claim)."""

    async def take(self) -> tuple[InboxOutcome, TakenAlong]:
        """The delivery's outcome, and those of the claims made along with it."""
        return await self.dedupe.claim(self.key, self.holder, self.along)

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
        self._claims: GroupCommit[_Asked, tuple[InboxOutcome, TakenAlong]] = GroupCommit(
            self._claim_batch, max_batch=policy.prefetch
        )
        self._completions: GroupCommit[InboxDone, None] = GroupCommit(
            self._complete_batch, max_batch=policy.prefetch
        )

    async def claim(
        self, key: str, holder: str, along: Sequence[AlongClaim] = ()
    ) -> tuple[InboxOutcome, TakenAlong]:
        """Claim the message id, and with it (at the first try) the claims `along`; while
        another delivery holds the id, wait for it, `busy_wait` at most (a copy handled right
        now ends sooner; one whose consumer died holds it until its claim expires, and the
        message must not wait for that in hand)."""
        loop = asyncio.get_running_loop()
        give_up = loop.time() + self._policy.busy_wait
        taken: TakenAlong = {}
        while True:
            claim = InboxClaim(key, holder, utcnow() + self._policy.claim_ttl)
            outcome, first = await self._claims.submit((claim, along))
            taken = taken or first
            along = ()
            if outcome is not InboxOutcome.BUSY or loop.time() >= give_up:
                return outcome, taken
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

    async def _claim_batch(self, items: Sequence[_Asked]) -> list[tuple[InboxOutcome, TakenAlong]]:
        # `now` read here: the batch's task runs in a context of its own (`_for_the_batch`),
        # without the caller's (a simulated process's clock is one).
        return await self._for_the_batch(self._claim_with_along(items, utcnow()))

    async def _claim_with_along(
        self, items: Sequence[_Asked], now: datetime
    ) -> list[tuple[InboxOutcome, TakenAlong]]:
        """The deliveries' claims and those made along with them, all asked for at once (on
        PostgreSQL they share one round trip: shared/store/postgres/inbox.py)."""
        by_queue: dict[str, list[InboxClaim]] = {}
        for _, along in items:
            for queue, claim in along:
                by_queue.setdefault(queue, []).append(claim)
        own, *others = await asyncio.gather(
            # Expiry judged allowing for the clock of the consumer that set it.
            self._store.inbox_claim_many(
                self._queue, [claim for claim, _ in items], now=now - self._policy.clock_skew
            ),
            *(self._store.inbox_claim_many(q, c, now=now) for q, c in by_queue.items()),
        )
        # Each claim's own answer (two copies of a message may ask for the same id along).
        answers = {
            id(claim): answer
            for claims, outcomes in zip(by_queue.values(), others, strict=True)
            for claim, answer in zip(claims, outcomes, strict=True)
        }
        return [
            (outcome, {(q, c.message_id): answers[id(c)] for q, c in along})
            for (_, along), outcome in zip(items, own, strict=True)
        ]

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
