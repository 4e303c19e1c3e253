"""Group commit: concurrent callers share one round trip.

A caller hands in one item and awaits its own result. When no flush is running the item goes at
once (an idle process pays no added latency); items that arrive while a flush is in flight wait
for it and then go together, up to `max_batch` per flush. Under load, batches form by
themselves, sized by the round trip rather than by a timer.

Which waiting items go next is the caller's to choose when the default (the first `max_batch`,
in arrival order) will not do: a `select` may keep two writes of one record out of one flush, or
put only the same statement in it. A flush answers each item with its result, or with an
exception for that item alone.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")

Flush = Callable[[Sequence[T]], Awaitable[Sequence[R | Exception]]]
"""Handles a batch; returns one result per item, in order (an exception: that item failed)."""

Select = Callable[[Sequence[T], int], Sequence[int]]
"""Given the waiting items and `max_batch`: the positions of those that go in the next flush, in
the order they go (none chosen: the first goes alone); the others wait for a later flush."""


def first_ones(waiting: Sequence[object], max_batch: int) -> Sequence[int]:
    """The default `Select`: the first `max_batch` waiting items, in arrival order."""
    return range(min(len(waiting), max_batch))


class GroupCommit(Generic[T, R]):
    def __init__(
        self, flush: Flush[T, R], *, max_batch: int = 100, select: Select[T] = first_ones
    ) -> None:
        if max_batch < 1:
            raise ValueError("max_batch must be at least 1")
        self._flush = flush
        self._max_batch = max_batch
        self._select = select
        self._waiting: list[tuple[T, asyncio.Future[R]]] = []
        self._flusher: asyncio.Task[None] | None = None

    async def submit(self, item: T) -> R:
        """The item's result; the flush's exception when its batch failed."""
        return await self.enqueue(item)  # a cancelled caller's item may still go

    def enqueue(self, item: T) -> asyncio.Future[R]:
        """Hand in the item now; the future of its result (or of the flush's exception). Items
        enqueued one after another, with no wait between them, go in one flush (as far as the
        batch and `select` allow)."""
        future: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        self._waiting.append((item, future))
        if self._flusher is None:
            self._flusher = asyncio.create_task(self._run())
        return future

    async def settled(self) -> None:
        """Return once every item handed in so far has been flushed (or has failed), whether or
        not its caller still waits for it: what a closing owner waits for before it lets go of
        what the flushes use."""
        while self._flusher is not None:
            await asyncio.wait([self._flusher])

    async def _run(self) -> None:
        try:
            while self._waiting:
                await self._settle(self._next_batch())
        except asyncio.CancelledError:
            for _, future in self._waiting:
                future.cancel()
            self._waiting.clear()
            raise
        finally:
            self._flusher = None

    def _next_batch(self) -> list[tuple[T, asyncio.Future[R]]]:
        chosen = list(self._select([item for item, _ in self._waiting], self._max_batch)) or [0]
        taken = set(chosen)
        batch = [self._waiting[i] for i in chosen]
        self._waiting = [w for i, w in enumerate(self._waiting) if i not in taken]
        return batch

    async def _settle(self, batch: list[tuple[T, asyncio.Future[R]]]) -> None:
        try:
            results = await self._flush([item for item, _ in batch])
            if len(results) != len(batch):
                raise RuntimeError(f"a flush of {len(batch)} items gave {len(results)} results")
        except asyncio.CancelledError:
            for _, future in batch:
                if not future.done():
                    future.cancel()
            raise
        except Exception as exc:
            for _, future in batch:
                if not future.done():
                    future.set_exception(exc)
            return
        for (_, future), result in zip(batch, results, strict=True):
            _answer(future, result)


def _answer(future: asyncio.Future[R], result: R | Exception) -> None:
    """One caller's answer; none for a caller that stopped waiting."""
    if future.done():
        return
    if isinstance(result, Exception):
        future.set_exception(result)
    else:
        future.set_result(result)
