"""The inbox on PostgreSQL: MessageId dedupe for the consumers (`Inbox`).

Every claim and completion of the store's callers in this process goes through one round-trip
batcher (a `GroupCommit` choosing calls with no id in common): calls made while a round trip is
in flight go together in the next one, as one statement, whatever their queue and kind. An
agent's message claims, its attempt tickets (claims under `<queue>:attempts`) and its
completions, which were three round trips, share one under load.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from shared.batching import GroupCommit
from shared.domain.coordination import InboxOutcome
from shared.store.postgres.connection import PostgresPart, affected
from shared.store.values import InboxClaim, InboxDone

MAX_ENTRIES = 500
"""Entries one round trip writes at most (more calls wait for the next)."""


DONE_LINGER_S = 0.06
"""How long a completion waits for a claim to go with it
(decision:completion-waits-for-claim-postgresql): a consumer's completion
of one message rides in the round trip that claims its next, instead of being a statement (and
a commit) of its own. The message's ack waits as long; the step it was goes on at once."""


class PostgresInbox(PostgresPart):
    _round_trips: GroupCommit[_Call, set[str]] | None = None
    _lingering: list[tuple[_Call, asyncio.Future[set[str]]]] | None = None
    _linger_timer: asyncio.TimerHandle | None = None

    def _batcher(self) -> GroupCommit[_Call, set[str]]:
        """Group commit of inbox writes: a call made while none is in flight goes at once;
        calls made meanwhile go together next, each id at most once per statement."""
        if self._round_trips is None:
            self._round_trips = GroupCommit(
                self._write_entries, max_batch=MAX_ENTRIES, select=_disjoint_calls
            )
        return self._round_trips

    async def _submit(self, call: _Call) -> set[str]:
        if not call.size:
            return set()
        if call.claims or DONE_LINGER_S <= 0:
            return await self._go_with(call)
        return await self._linger(call)

    async def _write_lingering(self) -> None:
        """Write the completions still waiting for a claim, and wait for every write handed to
        the round trips (a stopping process's last ones), whether or not their callers still
        wait: a handling cancelled by a drain, or a notifier's task, leaves its completion
        behind it, and the pool closes next."""
        self._hand_lingering()
        if self._round_trips is not None:
            await self._round_trips.settled()

    async def _linger(self, call: _Call) -> set[str]:
        """Completions only: wait, `DONE_LINGER_S` at most, for a claim to go with."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[set[str]] = loop.create_future()
        if self._lingering is None:
            self._lingering = []
        self._lingering.append((call, future))
        if self._linger_timer is None:
            self._linger_timer = loop.call_later(DONE_LINGER_S, self._hand_lingering)
        return await future

    def _go_with(self, call: _Call) -> asyncio.Future[set[str]]:
        """Hand `call` to the round trips with the lingering completions just ahead of it:
        enqueued with no wait between them, they go together (unless an id of theirs is in the
        batch already, when the later call waits for the next round trip)."""
        self._hand_lingering()
        return self._batcher().enqueue(call)

    def _hand_lingering(self) -> None:
        """Hand the lingering completions to the round trips (at the timer, or ahead of a
        claim, or at closing)."""
        if self._linger_timer is not None:
            self._linger_timer.cancel()
            self._linger_timer = None
        lingering, self._lingering = self._lingering or [], None
        for waiting, future in lingering:
            # A caller that stopped waiting: its completion goes anyway.
            _chain(self._batcher().enqueue(waiting), future)

    async def inbox_claim_many(
        self, queue: str, claims: Sequence[InboxClaim], *, now: datetime
    ) -> list[InboxOutcome]:
        first: dict[str, InboxClaim] = {}
        for claim in claims:
            first.setdefault(claim.message_id, claim)
        taken = await self._submit(_Call(queue, claims=list(first.values()), now=now))
        # Rare (a duplicate, or a copy being handled elsewhere): one primary-key read each.
        states = {
            m: await self._pool.fetchval(
                f"SELECT state FROM {self._s}.inbox WHERE queue = $1 AND message_id = $2",
                queue,
                m,
            )
            for m in first
            if m not in taken
        }
        return [_outcome(c, first[c.message_id], taken, states) for c in claims]

    async def inbox_complete_many(self, queue: str, done: Sequence[InboxDone]) -> None:
        # The last of several completions of one id in a call is the one that stands.
        last = {d.message_id: d for d in done}
        await self._submit(_Call(queue, done=list(last.values())))

    async def _write_entries(self, calls: Sequence[_Call]) -> list[set[str]]:
        """One statement for the calls' claims and completions (no id twice among them); the
        ids each call's claims took. An entry is claimed when it is new, or expired (a dedupe
        window that passed, or a claim whose holder died), or held by the same holder; it is
        marked done unless another holder has taken its id since (an upsert: the purge may have
        deleted a claim that expired while its message was handled, and the dedupe record must
        be written anyway). The rows go in one order, (queue, id), for every round trip: two
        processes writing the same ids wait for each other instead of deadlocking."""
        rows = sorted(
            [
                *(
                    (c.queue, x.message_id, "processing", x.holder, x.claim_until)
                    for c in calls
                    for x in c.claims
                ),
                *(
                    (c.queue, d.message_id, "done", d.holder, d.keep_until)
                    for c in calls
                    for d in c.done
                ),
            ],
            key=lambda r: (r[0], r[1]),
        )
        # Expiry judged at the earliest `now` of the calls: an entry that expired only later
        # counts as live (the caller waits, or counts a ticket as spent: the safe side).
        nows = [c.now for c in calls if c.now is not None]
        now = min(nows) if nows else datetime.now(UTC)
        returned = await self._pool.fetch(
            f"""
            INSERT INTO {self._s}.inbox AS i (queue, message_id, state, holder, expires_at)
            SELECT q, m, s, h, e
              FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::timestamptz[])
                   WITH ORDINALITY AS x(q, m, s, h, e, k)
             ORDER BY k
            ON CONFLICT (queue, message_id) DO UPDATE
               SET state = EXCLUDED.state, holder = EXCLUDED.holder,
                   expires_at = EXCLUDED.expires_at
             WHERE CASE WHEN EXCLUDED.state = 'done' THEN i.holder = EXCLUDED.holder
                        ELSE i.expires_at <= $6
                             OR (i.holder = EXCLUDED.holder AND i.state = 'processing') END
            RETURNING queue, message_id, state
            """,
            [r[0] for r in rows],
            [r[1] for r in rows],
            [r[2] for r in rows],
            [r[3] for r in rows],
            [r[4] for r in rows],
            now,
        )
        taken = {(r["queue"], r["message_id"]) for r in returned if r["state"] == "processing"}
        return [{x.message_id for x in c.claims if (c.queue, x.message_id) in taken} for c in calls]

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
    "INSERT INTO {s}.inbox AS i (queue, message_id, state, holder, expires_at) "
    "VALUES ($1, $2, 'done', $3, $4) ON CONFLICT (queue, message_id) DO UPDATE "
    "SET state = 'done', expires_at = EXCLUDED.expires_at WHERE i.holder = EXCLUDED.holder"
)


@dataclass
class _Call:
    """One caller's claims (distinct ids) or completions (distinct ids) of one queue."""

    queue: str
    claims: list[InboxClaim] = field(default_factory=list)
    done: list[InboxDone] = field(default_factory=list)
    now: datetime | None = None

    @property
    def keys(self) -> set[tuple[str, str]]:
        return {(self.queue, x.message_id) for x in self.claims} | {
            (self.queue, d.message_id) for d in self.done
        }

    @property
    def size(self) -> int:
        return len(self.claims) + len(self.done)


def _chain(source: asyncio.Future[set[str]], target: asyncio.Future[set[str]]) -> None:
    """`target` gets `source`'s outcome when it has one (unless it was cancelled)."""

    def copy(done: asyncio.Future[set[str]]) -> None:
        if done.cancelled():
            if not target.done():
                target.cancel()
            return
        exc = done.exception()  # retrieved even when nobody waits for it any more
        if target.done():
            return
        if exc is not None:
            target.set_exception(exc)
        else:
            target.set_result(done.result())

    source.add_done_callback(copy)


def _disjoint_calls(waiting: Sequence[_Call], _: int) -> list[int]:
    """The waiting calls that go next, in order: each unless an id of it is in the batch already
    or in a call left waiting before it (so calls on one id keep their order), or the batch is
    full (`MAX_ENTRIES`)."""
    chosen: list[int] = []
    keys: set[tuple[str, str]] = set()
    left: set[tuple[str, str]] = set()
    size = 0
    for i, call in enumerate(waiting):
        call_keys = call.keys
        full = bool(chosen) and size + call.size > MAX_ENTRIES
        if full or not call_keys.isdisjoint(keys) or not call_keys.isdisjoint(left):
            left |= call_keys
            continue
        chosen.append(i)
        keys |= call_keys
        size += call.size
    return chosen


def _outcome(
    claim: InboxClaim, head: InboxClaim, taken: set[str], states: dict[str, str | None]
) -> InboxOutcome:
    """One claim's outcome; `head` is the call's first claim of the same id."""
    if claim.message_id in taken:
        # A later copy of the id by another holder in the same call finds it taken, as it
        # would a moment later.
        mine = head is claim or head.holder == claim.holder
        return InboxOutcome.CLAIMED if mine else InboxOutcome.BUSY
    done = states.get(claim.message_id) == "done"
    return InboxOutcome.DUPLICATE if done else InboxOutcome.BUSY
