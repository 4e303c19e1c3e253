"""A consumer's hold on its queue: its subscription (prefetch, pause, resume, and on stop a bounded
drain of the deliveries in hand), and what its intake is doing, for the heartbeat, `/healthz` and
`orderflow stats`. What becomes of each delivery is the consumer's (shared/broker/consumer.py,
a `Subscription` that decides every delivery's outcome).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from shared import clock
from shared.broker.delivery import intake_state
from shared.broker.port import Connection, Feed, Incoming
from shared.broker.topology import Names
from shared.errors import ConfigurationError


class Subscription:
    """Takes the deliveries of one input queue of the hub and hands each to `_deliver`."""

    def __init__(self, *, connection: Connection, queue: str, names: Names, prefetch: int) -> None:
        self._connection = connection
        self._queue_name = queue
        self._names = names
        self._prefetch = prefetch
        self._feed: Feed | None = None
        """The channel it consumes on, its own (opened by `start`)."""
        self._tag: str | None = None
        self._inflight: set[asyncio.Task[None]] = set()
        self._switch = asyncio.Lock()
        """Held by `pause`, `resume` and `stop`, so each sees the consumer tag the one before
        it left: interleaved, two pauses cancelled one tag twice and the second cleared the tag
        a resume had made in between, which then delivered for good (issue 33)."""
        self._stopped = False
        self.last_taken: float | None = None
        """`clock.monotonic()` of the last delivery taken (None: none yet)."""
        self.subscribed_at: float | None = None

    @property
    def queue(self) -> str:
        return self._queue_name

    async def start(self) -> None:
        admin = await self._connection.admin()
        try:
            for exchange in (
                self._names.retry(self._queue_name),
                self._names.dlq(self._queue_name),
            ):
                if not await admin.has_exchange(exchange):
                    # Setting a message aside or dead-lettering it would close the shared
                    # publisher's channel, every time.
                    raise ConfigurationError(
                        f"exchange {exchange} does not exist: run `orderflow init` (this "
                        "release adds it) and load the RabbitMQ definitions again"
                    )
        finally:
            await admin.close()
        self._feed = await self._connection.feed(prefetch=self._prefetch)
        async with self._switch:
            await self._subscribe()  # no such queue: `QueueMissing` (the CLI names `init`)

    async def _subscribe(self) -> None:
        assert self._feed is not None
        self._tag = await self._feed.consume(self._queue_name, self._take)
        self.subscribed_at = clock.monotonic()

    @property
    def paused(self) -> bool:
        """Subscribed once, and not taking messages now: paused, or stopped (not while it
        starts: a heartbeat then said "paused" for a consumer about to subscribe)."""
        return self.subscribed_at is not None and self._tag is None

    @property
    def in_hand(self) -> int:
        """Deliveries being handled right now."""
        return len(self._inflight)

    async def subscribed(self) -> bool:
        """Whether the broker still delivers to this consumer: it has not been paused, and its
        channel is open and still knows the consumer (the broker may cancel one, e.g. when
        its queue is deleted, and a channel closed by an error drops them all)."""
        if self._tag is None or self._feed is None:
            return False
        return await self._feed.consuming(self._tag)

    async def intake(self, *, ready: int | None, stall_after_s: float) -> dict[str, Any]:
        """This consumer's intake, for the heartbeat, `/healthz` and `orderflow stats`; `ready`
        is its queue's depth, read by the caller on a channel of its own (a passive declare of
        a queue that is gone closes the channel it runs on, and must not close this one's)."""
        since = self.last_taken or self.subscribed_at
        idle_s = clock.monotonic() - since if since is not None else 0.0
        state = intake_state(
            started=self._feed is not None,
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

    async def pause(self) -> bool:
        """Stop taking new messages; the ones in hand finish normally. True when this call
        stopped the intake, False when it was stopped already (or never started). A cancel the
        broker refuses (the connection is down) raises and leaves the consumer subscribed."""
        async with self._switch:
            return await self._cancel()

    async def resume(self) -> bool:
        """Take messages again; True when this call subscribed (never after `stop`)."""
        async with self._switch:
            if self._feed is None or self._tag is not None or self._stopped:
                return False
            await self._subscribe()
            if self._stopped:  # `stop()` gave up waiting for this resume meanwhile
                with contextlib.suppress(Exception):
                    await self._cancel()
                return False
            return True

    async def _cancel(self) -> bool:
        tag = self._tag
        if self._feed is None or tag is None:
            return False
        await self._feed.cancel(tag)
        if self._tag == tag:  # only the tag cancelled is gone, never one made meanwhile
            self._tag = None
        return True

    async def stop(self, drain_timeout: float = 10.0) -> None:
        """Stop taking messages (whichever consumer is live once a pause or resume under way
        has ended), let the ones in hand finish (bounded), cancel the rest."""
        self._stopped = True  # no resume from here on
        # A pause or resume under way past `drain_timeout` (waiting for the broker) finishes
        # on its own: a resume then finds the subscription stopped and cancels what it made.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(drain_timeout), self._switch:
                try:
                    await self._cancel()
                except Exception:  # a refused cancel (the connection is down): drain anyway
                    self._tag = None
        if self._inflight:
            _, pending = await asyncio.wait(self._inflight, timeout=drain_timeout)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        if self._feed is not None:
            with contextlib.suppress(Exception):  # what it still holds goes back with it
                await self._feed.close()

    async def _take(self, message: Incoming) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._inflight.add(task)
        self.last_taken = clock.monotonic()
        try:
            await self._deliver(message)
        finally:
            if task is not None:
                self._inflight.discard(task)

    async def _deliver(self, message: Incoming) -> None:
        """What becomes of one delivery (the consumer's outcome table)."""
        raise NotImplementedError
