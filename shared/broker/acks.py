"""A consumer's positive acks, sent together: one `basic.ack` with `multiple` for the deliveries
whose handling ended side by side, instead of one frame (and one broker command) each.

Handlings end in bursts: a group commit answers all its callers at once (shared/batching.py), and
they all ack in the same turn of the event loop. Each ack waits for the next turn; the acks asked
for by then go out together.

`multiple=True` acks every unsettled delivery of the channel up to its tag, so it is sent only
for a tag below which no delivery is still unsettled but those being acked: any other delivery in
hand with a lower tag (still being handled, or settled by a frame not yet written: aio-pika marks
a message processed only once its frame is queued) keeps the ones above it out of the multiple
ack, and they are acked one by one. A delivery of an earlier incarnation of the channel (before a
reconnection) is acked alone, on its own channel, and fails as it would have.

Every ack still waits until its frame has been handed to the connection, as `message.ack()` does,
and a failure reaches each caller whose delivery it was meant to settle.
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection

from aio_pika.abc import AbstractIncomingMessage

Pending = tuple[AbstractIncomingMessage, asyncio.Future[None]]
"""A delivery to ack, and the future its handling waits on."""


class Acks:
    """The acks of one consumer's channel."""

    def __init__(self, in_hand: Collection[AbstractIncomingMessage]) -> None:
        self._in_hand = in_hand
        """The deliveries being handled on this channel right now (those acked included)."""
        self._waiting: list[Pending] = []
        self._sender: asyncio.Task[None] | None = None

    async def ack(self, message: AbstractIncomingMessage) -> None:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.append((message, future))
        if self._sender is None:
            self._sender = asyncio.get_running_loop().create_task(self._send())
        await future

    async def _send(self) -> None:
        try:
            while self._waiting:
                batch, self._waiting = self._waiting, []
                await self._settle(batch)
        finally:
            self._sender = None

    async def _settle(self, batch: list[Pending]) -> None:
        together, alone = self.together(batch)
        if together:
            last = together[-1]
            try:
                await last[0].ack(multiple=len(together) > 1)
            except Exception as exc:
                for _, future in together:
                    _fail(future, exc)
            else:
                for _, future in together:
                    _done(future)
        for message, future in alone:
            try:
                await message.ack()
            except Exception as exc:
                _fail(future, exc)
            else:
                _done(future)

    def together(self, batch: list[Pending]) -> tuple[list[Pending], list[Pending]]:
        """(the acks one multiple ack settles, in tag order; the ones acked alone)."""
        if len(batch) == 1:
            return batch, []
        channel = batch[-1][0].channel
        acking = {id(m) for m, _ in batch}
        others = [
            m.delivery_tag
            for m in self._in_hand
            if id(m) not in acking
            and m.channel is channel
            and not m.processed
            and m.delivery_tag is not None
        ]
        below = min(others, default=None)
        together: list[Pending] = []
        alone: list[Pending] = []
        for entry in sorted(batch, key=lambda e: e[0].delivery_tag or 0):
            message = entry[0]
            tag = message.delivery_tag
            if message.channel is channel and tag is not None and (below is None or tag < below):
                together.append(entry)
            else:
                alone.append(entry)
        return together, alone


def _done(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _fail(future: asyncio.Future[None], exc: BaseException) -> None:
    if not future.done():
        future.set_exception(exc)
