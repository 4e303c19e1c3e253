"""Where orderflow reads the time: the wall clock and a monotonic clock, replaceable together.

Every read of the time in orderflow's processes goes through `wall()`, `utcnow()` or
`monotonic()` (timeouts and sleeps go through the event loop, whose clock is the loop's own). A
real process reads the system's clocks. `orderflow simulate` runs every process of a topology as
tasks of one event loop under virtual time, each process with a clock of its own that may jump
(harness/simulation): it sets `CLOCK` in each process's context, and every task the process
starts inherits it.
"""

from __future__ import annotations

import time
from contextvars import ContextVar
from datetime import UTC, datetime, timedelta
from typing import Protocol


class Clock(Protocol):
    def wall(self) -> float:
        """Seconds since the epoch (the host's clock: it may be set back or forward)."""

    def monotonic(self) -> float:
        """Seconds from an arbitrary origin, never going back (measures intervals)."""


class SystemClock:
    """The host's clocks."""

    def wall(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()


EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
SYSTEM = SystemClock()
CLOCK: ContextVar[Clock] = ContextVar("orderflow_clock", default=SYSTEM)
"""The clock of the process the current task belongs to."""


def wall() -> float:
    return CLOCK.get().wall()


def monotonic() -> float:
    return CLOCK.get().monotonic()


def now() -> datetime:
    """Now, in UTC, to the microsecond (a time that names an event, never stored)."""
    return datetime.fromtimestamp(CLOCK.get().wall(), UTC)


def utcnow() -> datetime:
    """Now, in UTC, to the millisecond: the precision every store keeps, so a time read back
    from any store compares equal to the one written."""
    return EPOCH + timedelta(milliseconds=int(CLOCK.get().wall() * 1000))
