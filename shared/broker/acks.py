"""A consumer's positive acks, sent together: one `basic.ack` with `multiple` for the deliveries
whose handling ended side by side, instead of one frame (and one broker command) each.

Handlings end in bursts: a group commit answers all its callers at once (shared/batching.py), and
they all ack in the same turn of the event loop. Each ack waits for the next turn; the acks asked
for by then go out together.

`multiple=True` acks every unsettled delivery of the channel up to its tag, so it is sent only
for a tag below which no delivery of that channel is unsettled but those being acked. The book
of unsettled deliveries is kept here, not read off the handlings in hand: a delivery is entered
when it is taken (with the channel it came on, read while that channel is open), and leaves the
book only once it is settled (acked here, or acked, rejected or returned by another path: a
delivery is `processed` once its settling frame is queued, shared/broker/port.py). One whose
handling ended without settling it (cancelled by a drain that timed out, or a requeue that
failed) stays in the book until its channel closes, and keeps every ack above it out of a
multiple ack: those go one by one. A delivery whose channel has closed (a reconnection since)
is acked alone, and fails as it would have.

Every ack still waits until its frame has been handed to the connection, as `message.ack()` does;
a failure, of the ack or of this bookkeeping, reaches each caller whose delivery it was meant to
settle, and no caller is left waiting.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass

from shared.broker.port import ChannelState, Incoming


@dataclass(eq=False)
class _Entry:
    message: Incoming
    channel: ChannelState | None
    """The channel it came on (None: it could not be read, which acks it alone)."""

    @property
    def tag(self) -> int:
        return self.message.delivery_tag or 0

    @property
    def settled(self) -> bool:
        """Settled by another path (`processed` once its frame is queued); one acked here has
        left the book already."""
        return self.message.processed

    @property
    def open(self) -> bool:
        return self.channel is not None and not self.channel.is_closed


@dataclass(eq=False)
class _Pending:
    entry: _Entry
    future: asyncio.Future[None]


class Acks:
    """The acks of one consumer's deliveries, and its book of those not yet settled."""

    def __init__(self) -> None:
        self._book: dict[int, _Entry] = {}
        """Deliveries taken and not known settled, by `id` of the message."""
        self._channel: ChannelState | None = None
        """The channel of the latest delivery: when one comes on another, the book is swept."""
        self._waiting: list[_Pending] = []
        self._sender: asyncio.Task[None] | None = None

    def taken(self, message: Incoming) -> None:
        """A delivery came: in the book until it is settled."""
        channel: ChannelState | None = None
        with contextlib.suppress(Exception):  # a closed channel's delivery raises
            channel = message.channel
        if channel is not self._channel:  # a reconnection: the old channel's entries can go
            self._channel = channel
            self._forget_closed()
        self._book[id(message)] = _Entry(message, channel)

    def left(self, message: Incoming) -> None:
        """Its handling ended. Settled, it leaves the book (acked here, it has left already);
        not (a cancelled handling, a failed requeue), it stays while its channel is open, and no
        multiple ack passes over it."""
        entry = self._book.get(id(message))
        if entry is not None and (entry.settled or not entry.open):
            del self._book[id(message)]

    @property
    def unsettled(self) -> int:
        """Deliveries in the book on open channels (handled right now, or left unsettled)."""
        return sum(1 for entry in self._book.values() if entry.open)

    async def ack(self, message: Incoming) -> None:
        entry = self._book.get(id(message))
        if entry is None:  # not taken through `taken` (cannot happen in the consumer): alone
            entry = _Entry(message, None)
        loop = asyncio.get_running_loop()
        pending = _Pending(entry, loop.create_future())
        self._waiting.append(pending)
        if self._sender is None:
            self._sender = loop.create_task(self._send())
        await pending.future

    async def _send(self) -> None:
        try:
            while self._waiting:
                batch, self._waiting = self._waiting, []
                try:
                    await self._settle(batch)
                except BaseException as exc:
                    _fail_all(batch, exc)
                    raise
        except BaseException as exc:
            # Cancelled (the loop is stopping) or broken: nobody is left waiting.
            waiting, self._waiting = self._waiting, []
            _fail_all(waiting, exc)
            if not isinstance(exc, Exception):
                raise
        finally:
            self._sender = None

    async def _settle(self, batch: list[_Pending]) -> None:
        together, alone = self.together(batch)
        if together:
            last = together[-1].entry
            try:
                await last.message.ack(multiple=len(together) > 1)
            except Exception as exc:
                _fail_all(together, exc)
            else:
                for pending in together:
                    self._acked(pending)
        for pending in alone:
            try:
                await pending.entry.message.ack()
            except Exception as exc:
                _fail_all([pending], exc)
            else:
                self._acked(pending)

    def _acked(self, pending: _Pending) -> None:
        """Out of the book at once, whether or not its handling still waits (a multiple ack
        marks only its last message processed)."""
        self._book.pop(id(pending.entry.message), None)
        _done(pending.future)

    def together(self, batch: list[_Pending]) -> tuple[list[_Pending], list[_Pending]]:
        """(the acks one multiple ack settles, in tag order; the ones acked alone)."""
        open_ones = [p for p in batch if p.entry.open]
        if len(open_ones) < 2:
            return open_ones, [p for p in batch if not p.entry.open]
        channel = open_ones[-1].entry.channel
        acking = {id(p.entry) for p in batch}
        below = min(
            (
                e.tag
                for e in self._book.values()
                if e.channel is channel and id(e) not in acking and not e.settled
            ),
            default=None,
        )
        together: list[_Pending] = []
        alone: list[_Pending] = []
        for pending in sorted(batch, key=lambda p: p.entry.tag):
            entry = pending.entry
            same = entry.channel is channel and entry.open
            first = below is None or entry.tag < below
            if same and entry.message.delivery_tag is not None and first:
                together.append(pending)
            else:
                alone.append(pending)
        return together, alone

    def _forget_closed(self) -> None:
        """Entries of closed channels settle nothing any more (their deliveries went back to
        their queues with the channel), and no multiple ack can pass over them (`together`
        looks at one open channel): out of the book. An ack still asked for one holds its
        entry, and is sent alone."""
        closed = [key for key, entry in self._book.items() if not entry.open]
        for key in closed:
            del self._book[key]


def _done(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _fail_all(batch: list[_Pending], exc: BaseException) -> None:
    for pending in batch:
        if pending.future.done():
            continue
        if isinstance(exc, asyncio.CancelledError):
            pending.future.cancel()
        else:
            pending.future.set_exception(exc)
