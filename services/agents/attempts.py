"""Attempt tickets: what a step request has spent of its allowance, kept across every handling.

A request can be handled more than once: the consumer runs its handler again in place after a
store outage, sets it aside and runs it again after an unexpected exception, and a request whose
agent died (or whose inbox claim expired) is delivered again, to this agent or another. Counting
attempts in the handler would give each handling a fresh allowance, and a reply that names only
the last handling's attempts would give the scheduler back budget that was spent.

So each remote attempt takes a ticket first, durably, before the call: ticket `n` of a request
(`1 <= n <= attempts_allowed`) is taken once, ever, by whichever handling asks first. A handling
that finds a ticket taken moves on to the next; when none is left it makes no call. The request's
spent attempts are the tickets known taken (by this handling or an earlier one), which is what
the reply reports: never fewer than the calls made, so the scheduler's settlement never gives
back an attempt that was spent. A ticket taken by a handling that died before it called is
counted as spent (the safe side).

Tickets are inbox entries under a name of their own (`<agent queue>:attempts`, which no consumer
reads), each claimed by a holder used once and kept until well after the request's deadline: the
inbox is the store's "take this key once within a window" primitive, which is what a ticket is,
so the store's port and schema stay as they are, and both stores have it. The first ticket of a
request is asked for with the request's own inbox claim, in one round trip
(decision:first-attempt-ticket-with-inbox-claim): the
handling is handed its outcome (`Allowance(first=...)`) and asks the store from ticket 2 on.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Protocol

from shared.batching import GroupCommit
from shared.domain.coordination import InboxOutcome
from shared.domain.timing import utcnow
from shared.store.port import InboxClaim


class Tickets(Protocol):
    """The port: take attempt tickets of requests, once each."""

    async def take(self, request: str, number: int, *, keep_until: datetime) -> bool:
        """Take ticket `number` of `request`: True for the first taker, False ever after (until
        `keep_until`, past the request's deadline, when nobody asks any more)."""


class InboxClaims(Protocol):
    """The part of the store tickets use."""

    async def inbox_claim_many(
        self, queue: str, claims: Sequence[InboxClaim], *, now: datetime
    ) -> list[InboxOutcome]: ...


def ticket_id(request: str, number: int) -> str:
    """The inbox message id of ticket `number` of `request`."""
    return f"{request}#{number}"


def ticket_claim(request: str, number: int, *, keep_until: datetime) -> InboxClaim:
    """The inbox claim that takes ticket `number` of `request`, by a holder used once."""
    return InboxClaim(ticket_id(request, number), uuid.uuid4().hex, keep_until)


class InboxTickets:
    """Tickets in the store's inbox: one claim per ticket, by a holder that claims nothing else
    (the inbox lets a holder claim again; a ticket must never be handed out twice). Tickets
    asked for side by side share one round trip (group commit, as the consumers' inbox does)."""

    def __init__(self, store: InboxClaims, queue: str, *, max_batch: int = 100) -> None:
        self._store = store
        self._queue = f"{queue}:attempts"
        self._claims: GroupCommit[InboxClaim, InboxOutcome] = GroupCommit(
            self._claim_batch, max_batch=max_batch
        )

    @property
    def queue(self) -> str:
        """The inbox queue the tickets are claims in."""
        return self._queue

    async def take(self, request: str, number: int, *, keep_until: datetime) -> bool:
        claim = ticket_claim(request, number, keep_until=keep_until)
        return await self._claims.submit(claim) is InboxOutcome.CLAIMED

    async def _claim_batch(self, claims: Sequence[InboxClaim]) -> list[InboxOutcome]:
        return await self._store.inbox_claim_many(self._queue, claims, now=utcnow())


class MemoryTickets:
    """The in-memory fake of `Tickets` (unit tests, one process)."""

    def __init__(self) -> None:
        self.taken: set[tuple[str, int]] = set()

    async def take(self, request: str, number: int, *, keep_until: datetime) -> bool:
        if (request, number) in self.taken:
            return False
        self.taken.add((request, number))
        return True


class Allowance:
    """One handling's view of a request's allowance: the tickets it may still take."""

    def __init__(
        self,
        tickets: Tickets,
        request: str,
        allowed: int,
        *,
        keep_until: datetime,
        first: bool | None = None,
    ):
        """`first`: whether ticket 1 was taken for this handling already, along with its
        message's inbox claim (decision:first-attempt-ticket-with-inbox-claim); None when it was not
        asked for."""
        self._tickets = tickets
        self._request = request
        self.allowed = allowed
        self._keep_until = keep_until
        self._next = 1
        self._first = first

    @property
    def spent(self) -> int:
        """Attempts known spent on the request: every ticket below the next one asked for was
        taken, by this handling or an earlier one."""
        return self._next - 1

    @property
    def left(self) -> bool:
        """Whether a ticket may still be left (one not yet asked for)."""
        return self._next <= self.allowed

    async def take(self) -> bool:
        """Take the next free ticket: True when this handling may make one more call. A store
        failure raises, and leaves the count as it was (the ticket may have been taken: the
        handling that runs next finds it so, and counts it)."""
        while self._next <= self.allowed:
            if self._next == 1 and self._first is not None:
                taken = self._first
            else:
                taken = await self._tickets.take(
                    self._request, self._next, keep_until=self._keep_until
                )
            self._next += 1
            if taken:
                return True
        return False
