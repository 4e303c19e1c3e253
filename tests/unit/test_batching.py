"""Group commit: callers that arrive while a flush is in flight share the next one."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

import pytest

from shared.batching import GroupCommit
from tests.support.waiting import eventually


class Recorder:
    """A flush that holds each batch until released, and records the batches it saw."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []
        self.gate = asyncio.Event()
        self.fail_next = False

    async def flush(self, items: Sequence[int]) -> list[int]:
        self.batches.append(list(items))
        await self.gate.wait()
        if self.fail_next:
            self.fail_next = False
            raise ConnectionError("store down")
        return [i * 10 for i in items]


async def _until(condition: Callable[[], bool]) -> None:
    async def probe() -> bool:
        return condition()

    await eventually(probe, timeout=2.0, interval=0.001)


async def test_an_idle_batcher_sends_at_once_and_later_arrivals_share_the_next_flush() -> None:
    rec = Recorder()
    batcher: GroupCommit[int, int] = GroupCommit(rec.flush, max_batch=3)
    first = asyncio.create_task(batcher.submit(1))
    await _until(lambda: rec.batches == [[1]])
    others = [asyncio.create_task(batcher.submit(i)) for i in range(2, 7)]
    await asyncio.sleep(0)
    rec.gate.set()
    assert await first == 10
    assert await asyncio.gather(*others) == [20, 30, 40, 50, 60]
    assert rec.batches == [[1], [2, 3, 4], [5, 6]]


async def test_a_failed_flush_fails_its_own_batch_only() -> None:
    rec = Recorder()
    batcher: GroupCommit[int, int] = GroupCommit(rec.flush)
    rec.fail_next = True
    doomed = [asyncio.create_task(batcher.submit(i)) for i in (1, 2)]
    await _until(lambda: len(rec.batches) == 1)
    later = asyncio.create_task(batcher.submit(3))
    rec.gate.set()
    for task in doomed:
        with pytest.raises(ConnectionError):
            await task
    assert await later == 30


async def test_a_cancelled_caller_does_not_disturb_the_rest_of_its_batch() -> None:
    rec = Recorder()
    batcher: GroupCommit[int, int] = GroupCommit(rec.flush)
    tasks = [asyncio.create_task(batcher.submit(i)) for i in (1, 2)]
    await _until(lambda: len(rec.batches) == 1)
    tasks[0].cancel()
    rec.gate.set()
    assert await tasks[1] == 20
    assert tasks[0].cancelled()


async def test_a_flush_that_loses_results_is_an_error_for_its_callers() -> None:
    async def short(items: Sequence[int]) -> list[int]:
        return []

    batcher: GroupCommit[int, int] = GroupCommit(short)
    with pytest.raises(RuntimeError, match="gave 0 results"):
        await batcher.submit(1)


async def test_a_select_chooses_what_goes_next_and_the_rest_keep_their_turn() -> None:
    rec = Recorder()

    def evens_first(waiting: Sequence[int], max_batch: int) -> list[int]:
        evens = [i for i, item in enumerate(waiting) if item % 2 == 0]
        return sorted(evens[:max_batch], key=lambda i: -waiting[i])  # the order they go in

    batcher: GroupCommit[int, int] = GroupCommit(rec.flush, max_batch=2, select=evens_first)
    first = asyncio.create_task(batcher.submit(1))  # no even one waiting: the first goes alone
    await _until(lambda: rec.batches == [[1]])
    others = [asyncio.create_task(batcher.submit(i)) for i in (3, 2, 4, 6, 5)]
    await asyncio.sleep(0)
    rec.gate.set()
    assert await first == 10
    assert await asyncio.gather(*others) == [30, 20, 40, 60, 50]
    # 3 and 5 wait while an even one does; then, none chosen, each goes alone in turn.
    assert rec.batches == [[1], [4, 2], [6], [3], [5]]


async def test_a_flush_fails_one_item_alone_by_answering_it_with_an_exception() -> None:
    async def picky(items: Sequence[int]) -> list[int | Exception]:
        return [ValueError(f"no {i}") if i == 2 else i for i in items]

    batcher: GroupCommit[int, int] = GroupCommit(picky)
    results = await asyncio.gather(*(batcher.submit(i) for i in (1, 2, 3)), return_exceptions=True)
    assert results[0] == 1 and results[2] == 3
    assert isinstance(results[1], ValueError) and str(results[1]) == "no 2"


async def test_settled_waits_for_every_item_handed_in_even_with_no_caller_left() -> None:
    rec = Recorder()
    batcher: GroupCommit[int, int] = GroupCommit(rec.flush)
    in_flight = asyncio.create_task(batcher.submit(1))
    await _until(lambda: rec.batches == [[1]])
    waiting = batcher.enqueue(2)
    in_flight.cancel()
    waiting.cancel()  # nobody waits for either any more: both still go
    settled = asyncio.create_task(batcher.settled())
    await asyncio.sleep(0.01)
    assert not settled.done(), "a flush is still in flight"
    rec.gate.set()
    await asyncio.wait_for(settled, 2.0)
    assert rec.batches == [[1], [2]]
    await asyncio.wait_for(batcher.settled(), 2.0)  # idle: at once
