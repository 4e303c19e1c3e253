"""The inbox on PostgreSQL: MessageId dedupe for the consumers (`Inbox`)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from shared.domain.coordination import InboxOutcome
from shared.store.postgres.connection import PostgresPart, affected
from shared.store.values import InboxClaim, InboxDone


class PostgresInbox(PostgresPart):
    async def inbox_claim_many(
        self, queue: str, claims: Sequence[InboxClaim], *, now: datetime
    ) -> list[InboxOutcome]:
        first: dict[str, InboxClaim] = {}
        for claim in claims:
            first.setdefault(claim.message_id, claim)
        # One lock order for every batch: two consumers holding copies of the same messages
        # wait for each other instead of deadlocking.
        unique = sorted(first.values(), key=lambda c: c.message_id)
        taken = await self._take_ids(queue, unique, now)
        # Rare (a duplicate, or a copy being handled elsewhere): one primary-key read each.
        states = {
            c.message_id: await self._pool.fetchval(
                f"SELECT state FROM {self._s}.inbox WHERE queue = $1 AND message_id = $2",
                queue,
                c.message_id,
            )
            for c in unique
            if c.message_id not in taken
        }
        return [_outcome(c, first[c.message_id], taken, states) for c in claims]

    async def _take_ids(self, queue: str, unique: Sequence[InboxClaim], now: datetime) -> set[str]:
        """The ids of `unique` (one claim per id) that were new, or expired (a dedupe window
        that passed, or a claim whose holder died), or held by the same holder: now taken."""
        rows = await self._pool.fetch(
            f"""
            INSERT INTO {self._s}.inbox AS i (queue, message_id, state, holder, expires_at)
            SELECT $1, m, 'processing', h, e
              FROM unnest($2::text[], $3::text[], $4::timestamptz[])
                   WITH ORDINALITY AS x(m, h, e, k)
             ORDER BY k
            ON CONFLICT (queue, message_id) DO UPDATE
               SET state = 'processing', holder = EXCLUDED.holder, expires_at = EXCLUDED.expires_at
             WHERE i.expires_at <= $5 OR (i.holder = EXCLUDED.holder AND i.state = 'processing')
            RETURNING message_id
            """,
            queue,
            [c.message_id for c in unique],
            [c.holder for c in unique],
            [c.claim_until for c in unique],
            now,
        )
        return {r["message_id"] for r in rows}

    async def inbox_complete_many(self, queue: str, done: Sequence[InboxDone]) -> None:
        # One round trip (asyncpg pipelines the executions) of the one-row statement, whose
        # every plan is a primary-key lookup. A join against the batch was tried: its plan,
        # cached while the table was small, read the queue's whole inbox each time.
        await self._pool.executemany(
            _INBOX_COMPLETE.format(s=self._s),
            [(queue, d.message_id, d.holder, d.keep_until) for d in done],
        )

    async def inbox_release(self, queue: str, message_id: str, *, holder: str) -> bool:
        result = await self._pool.execute(
            f"DELETE FROM {self._s}.inbox WHERE queue = $1 AND message_id = $2 AND holder = $3 "
            "AND state = 'processing'",
            queue,
            message_id,
            holder,
        )
        return affected(result) == 1

    # Not on the port (the consumers claim and complete in batches); the contract suite's.
    async def inbox_claim(
        self, queue: str, message_id: str, *, holder: str, now: datetime, claim_until: datetime
    ) -> InboxOutcome:
        claim = InboxClaim(message_id, holder, claim_until)
        return (await self.inbox_claim_many(queue, [claim], now=now))[0]

    async def inbox_complete(
        self, queue: str, message_id: str, *, holder: str, keep_until: datetime
    ) -> bool:
        result = await self._pool.execute(
            _INBOX_COMPLETE.format(s=self._s), queue, message_id, holder, keep_until
        )
        return affected(result) == 1


_INBOX_COMPLETE = (
    # An upsert: the purge may have deleted a claim that expired while its message was
    # handled, and the dedupe record must be written anyway; an entry another holder took
    # since stays theirs.
    "INSERT INTO {s}.inbox AS i (queue, message_id, state, holder, expires_at) "
    "VALUES ($1, $2, 'done', $3, $4) ON CONFLICT (queue, message_id) DO UPDATE "
    "SET state = 'done', expires_at = EXCLUDED.expires_at WHERE i.holder = EXCLUDED.holder"
)


def _outcome(
    claim: InboxClaim, head: InboxClaim, taken: set[str], states: dict[str, str | None]
) -> InboxOutcome:
    """One claim's outcome; `head` is the batch's first claim of the same id."""
    if claim.message_id in taken:
        # A later copy of the id by another holder in the same batch finds it taken, as it
        # would a moment later.
        mine = head is claim or head.holder == claim.holder
        return InboxOutcome.CLAIMED if mine else InboxOutcome.BUSY
    done = states.get(claim.message_id) == "done"
    return InboxOutcome.DUPLICATE if done else InboxOutcome.BUSY
