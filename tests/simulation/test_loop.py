"""The virtual-time loop: time jumps to the next timer, a stall and a livelock are errors."""

from __future__ import annotations

import asyncio

import pytest

from harness.simulation import loop as virtual


def test_time_jumps_to_the_next_timer_and_timeouts_fire_in_virtual_time() -> None:
    async def main() -> tuple[list[float], float, bool]:
        loop = asyncio.get_running_loop()

        async def at(delay: float) -> float:
            await asyncio.sleep(delay)
            return loop.time()

        times = await asyncio.gather(at(30), at(10), at(20), at(10))
        timed_out = False
        try:
            await asyncio.wait_for(asyncio.sleep(3600), timeout=5)
        except TimeoutError:
            timed_out = True
        return times, loop.time(), timed_out

    times, now, timed_out = virtual.run(main())
    assert times == [30.0, 10.0, 20.0, 10.0]
    assert now == 35.0 and timed_out


def test_every_task_waiting_for_ever_is_a_stall() -> None:
    async def main() -> None:
        await asyncio.Event().wait()

    with pytest.raises(virtual.Stalled):
        virtual.run(main())


def test_work_that_never_ends_exhausts_the_budget() -> None:
    async def main() -> None:
        for _ in range(10**9):
            await asyncio.sleep(0)

    with pytest.raises(virtual.Runaway):
        virtual.run(main(), budget=1000)


def test_a_run_out_of_real_time_is_stopped() -> None:
    async def main() -> None:
        for _ in range(10**9):
            await asyncio.sleep(0)

    with pytest.raises(virtual.Runaway, match="real time"):
        virtual.run(main(), wall_s=0.2)


def test_a_callback_that_never_returns_is_interrupted() -> None:
    async def main() -> None:
        while True:  # no await: nothing but a signal gets in
            pass

    with pytest.raises(virtual.OutOfTime):
        virtual.run(main(), wall_s=0.1)
