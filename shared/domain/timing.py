"""Times, deadlines and the recovery backoff: small pure functions with parametrized tests."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

from shared import clock

utcnow = clock.utcnow
"""Now, in UTC, to the millisecond, by the clock of the process asking (shared/clock.py)."""


EARLIEST = datetime(1970, 1, 1, tzinfo=UTC)
LATEST = datetime(9000, 1, 1, tzinfo=UTC)
"""Times a message may carry: adding any deadline or retention to them stays within what
Python, PostgreSQL and BSON can represent (Python stops at year 9999)."""


def in_range(at: datetime) -> datetime:
    """`at` unchanged, or ValueError (a pydantic validator) when it is outside the years above."""
    if not EARLIEST <= at < LATEST:
        raise ValueError(f"{at.isoformat()} is outside {EARLIEST.year}-{LATEST.year - 1}")
    return at


def deadline(now: datetime, timeout: timedelta) -> datetime:
    """The `complete_by` of a step started at `now`."""
    if timeout <= timedelta(0):
        raise ValueError("a step timeout must be positive")
    return now + timeout


def is_expired(complete_by: datetime | None, now: datetime) -> bool:
    return complete_by is not None and complete_by <= now


def recovery_backoff(
    failure_count: int,
    *,
    base: timedelta,
    cap: timedelta,
    cooldown_after: int,
    cooldown: timedelta,
    rng: random.Random | None = None,
) -> timedelta:
    """How long a recovered order waits before it may be claimed again.

    Exponential in the number of failures so far, capped, with "equal jitter" (half fixed, half
    random) so that orders recovered together do not stampede the remote service together. Past
    `cooldown_after` failures the order rests for the longer `cooldown` instead.
    """
    if failure_count < 1:
        raise ValueError("backoff is computed after at least one failure")
    if failure_count > cooldown_after:
        return cooldown
    exp = base * (1 << min(failure_count - 1, 40))
    delay = min(cap, exp)
    jitter: float = (rng or random).random()
    return delay / 2 + (delay / 2) * jitter
