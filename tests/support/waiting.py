"""Waiting on a condition with a deadline, never on a fixed sleep."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


async def eventually(
    probe: Callable[[], Awaitable[T]],
    *,
    timeout: float = 10.0,
    interval: float = 0.05,
    what: str = "condition",
) -> T:
    """Call `probe` until it returns something truthy; fail after `timeout` seconds."""
    loop = asyncio.get_running_loop()
    give_up = loop.time() + timeout
    last: T | None = None
    while loop.time() < give_up:
        last = await probe()
        if last:
            return last
        await asyncio.sleep(interval)
    raise AssertionError(f"{what} did not hold within {timeout}s (last value: {last!r})")
