"""`orderflow init`: the hub's store schema and indexes and its queues, once the servers answer."""

from __future__ import annotations

from tenacity import (
    AsyncRetrying,
    retry_if_exception_type,
    stop_before_delay,
    wait_exponential_jitter,
)

from shared.bootstrap import InitReport, initialise
from shared.config import Settings
from shared.errors import ServiceUnavailable


async def initialise_when_up(settings: Settings, wait_s: float) -> InitReport:
    """`initialise`, retried with backoff for up to `wait_s` while a server is unreachable
    (in a deployment, the servers may still be starting)."""
    async for attempt in AsyncRetrying(
        retry=retry_if_exception_type(ServiceUnavailable),
        stop=stop_before_delay(wait_s),
        wait=wait_exponential_jitter(multiplier=0.5, max=5.0, jitter=0.5),
        reraise=True,
    ):
        with attempt:
            return await initialise(settings)
    raise AssertionError("unreachable: tenacity reraises")
