"""An asyncio event loop under virtual time: when every task waits, time jumps to the next timer.

A simulation does no I/O (its store, broker and remote service live in memory), so the loop never
has anything to wait for but its own timers: the selector, asked to wait `timeout` seconds,
moves the clock forward by that much and returns at once. A minute of a topology's life costs
only the work its processes do in it, and the order in which callbacks run depends on nothing
but the program and its seed (the ready queue is first in, first out; timers fire in time
order, ties in the order they were set).
"""

from __future__ import annotations

import asyncio
import contextlib
import selectors
import signal
import threading
from collections.abc import Coroutine, Iterator, Mapping
from typing import Any, TypeVar

T = TypeVar("T")


class Stalled(Exception):
    """Every task waits on something no timer will ever bring: the simulation cannot go on."""


class Runaway(Exception):
    """The loop went round more times than its budget: work that never ends (a livelock)."""


class OutOfTime(KeyboardInterrupt):
    """A run still busy well past its real-time limit, inside one callback (a loop without an
    await): raised wherever it is, as an interrupt, the only exception asyncio lets through."""


class _TimeSelector(selectors.BaseSelector):
    """A selector with nothing to select: waiting is moving the virtual clock."""

    def __init__(self, budget: int) -> None:
        self.now = 0.0
        self.rounds = 0
        self.late: str | None = None
        """Set (from a signal handler) when the run is out of real time."""
        self._budget = budget
        self._keys: dict[Any, selectors.SelectorKey] = {}

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        key = selectors.SelectorKey(fileobj, _fd(fileobj), events, data)
        self._keys[fileobj] = key
        return key

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        return self._keys.pop(fileobj)

    def modify(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        self._keys.pop(fileobj, None)
        return self.register(fileobj, events, data)

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        self.rounds += 1  # the loop asks once a round
        if self.late is not None:
            late, self.late, self._budget = self.late, None, 2**62
            raise Runaway(late)
        if self.rounds > self._budget:
            self._budget = 2**62  # once: what runs to cancel the rest must not raise it again
            raise Runaway(f"{self.rounds - 1} rounds of the loop by virtual {self.now:.1f} s")
        if timeout is None:
            raise Stalled(f"every task is waiting and no timer is set (virtual {self.now:.1f} s)")
        self.now += max(0.0, timeout)
        return []

    def get_map(self) -> Mapping[Any, selectors.SelectorKey]:
        return dict(self._keys)

    def close(self) -> None:
        self._keys.clear()


def _fd(fileobj: Any) -> int:
    return fileobj if isinstance(fileobj, int) else int(fileobj.fileno())


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """`loop.time()` is virtual seconds since the loop was made; at most `budget` rounds."""

    def __init__(self, budget: int = 10**9) -> None:
        self._selector_clock = _TimeSelector(budget)
        super().__init__(self._selector_clock)
        self._clock_resolution = 1e-9

    def time(self) -> float:
        return self._selector_clock.now

    @property
    def rounds(self) -> int:
        return self._selector_clock.rounds


def run(main: Coroutine[Any, Any, T], *, budget: int = 10**9, wall_s: float | None = None) -> T:
    """Run `main` to its end on a fresh virtual-time loop, then close the loop: `Runaway` past
    `budget` rounds or (in the main thread) `wall_s` seconds of real time; `OutOfTime` if it is
    still busy a sixth of that (a second at least) later."""
    loop = VirtualTimeLoop(budget)
    with _real_time_limit(loop._selector_clock, wall_s):
        try:
            return loop.run_until_complete(main)
        finally:
            try:
                _cancel_the_rest(loop)
            finally:
                loop.close()


@contextlib.contextmanager
def _real_time_limit(selector: _TimeSelector, seconds: float | None) -> Iterator[None]:
    if seconds is None or threading.current_thread() is not threading.main_thread():
        yield
        return
    warned = False
    grace = max(1.0, seconds / 6)

    def expired(signum: int, frame: Any) -> None:
        nonlocal warned
        if warned:
            selector.late = None
            raise OutOfTime(f"still busy {seconds + grace:.0f} s of real time in")
        warned = True
        selector.late = f"more than {seconds:.0f} s of real time"
        signal.setitimer(signal.ITIMER_REAL, grace)

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _cancel_the_rest(loop: asyncio.AbstractEventLoop) -> None:
    rest = [t for t in asyncio.all_tasks(loop) if not t.done()]
    for task in rest:
        task.cancel()
    if rest:
        loop.run_until_complete(asyncio.gather(*rest, return_exceptions=True))
    loop.run_until_complete(loop.shutdown_asyncgens())
