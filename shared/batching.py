"""Group commit: concurrent callers share one round trip.

A caller hands in one item and awaits its own result. When no flush is running the item goes at
once (an idle process pays no added latency); items that arrive while a flush is in flight wait
for it and then go together, up to `max_batch` per flush. Under load, batches form by
themselves, sized by the round trip rather than by a timer.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")

Flush = Callable[[Sequence[T]], Awaitable[Sequence[R]]]
"""Handles a batch; returns one result per item, in order."""


class GroupCommit(Generic[T, R]):
    def __init__(self, flush: Flush[T, R], *, max_batch: int = 100) -> None:
        if max_batch < 1:
            raise ValueError("max_batch must be at least 1")
        self._flush = flush
        self._max_batch = max_batch
        self._waiting: list[tuple[T, asyncio.Future[R]]] = []
        self._flusher: asyncio.Task[None] | None = None

    async def submit(self, item: T) -> R:
        """The item's result; the flush's exception when its batch failed."""
        future: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        self._waiting.append((item, future))
        if self._flusher is None:
            self._flusher = asyncio.create_task(self._run())
        return await future  # a cancelled caller's item may still go; its result is dropped

    async def _run(self) -> None:
        try:
            while self._waiting:
                batch = self._waiting[: self._max_batch]
                del self._waiting[: self._max_batch]
                await self._settle(batch)
        except asyncio.CancelledError:
            for _, future in self._waiting:
                future.cancel()
            self._waiting.clear()
            raise
        finally:
            self._flusher = None

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
            if not future.done():
                future.set_result(result)
