"""One backoff for every loop that waits between tries: tenacity's exponential wait with jitter.

A retry that is a call tried again is a tenacity `AsyncRetrying` (`held`, the agent's remote
calls, `initialise_when_up`). A loop that must do something between its tries (watch a stop
event, keep an attempt's deadline ahead) takes its pauses from `Backoff` instead, so every wait
in orderflow grows the same way, and processes that failed together do not retry in step.
"""

from __future__ import annotations

from tenacity import AsyncRetrying, RetryCallState, wait_exponential_jitter
from tenacity.stop import stop_base

from shared import clock


class Backoff:
    """Pauses of `first`, about twice as long each time, up to `cap`, each with up to `jitter`
    (by default `first`) added at random."""

    def __init__(self, *, first: float, cap: float, jitter: float | None = None) -> None:
        if not 0 < first <= cap:
            raise ValueError("a backoff needs 0 < first <= cap")
        self._wait = wait_exponential_jitter(
            multiplier=first, max=cap, jitter=first if jitter is None else jitter
        )
        self._state = RetryCallState(retry_object=AsyncRetrying(), fn=None, args=(), kwargs={})

    def next(self) -> float:
        """The pause before the next try (the first call gives the first pause)."""
        pause = self._wait(self._state)
        self._state.attempt_number += 1
        return pause

    def reset(self) -> None:
        """After a success: the next failure waits `first` again."""
        self._state.attempt_number = 1


class stop_after(stop_base):
    """tenacity's `stop_after_delay`, timed by our clock (shared/clock.py) rather than the
    host's: a simulated process's patience runs out in virtual time."""

    def __init__(self, seconds: float) -> None:
        self._until = clock.monotonic() + seconds

    def __call__(self, retry_state: RetryCallState) -> bool:
        return clock.monotonic() >= self._until
