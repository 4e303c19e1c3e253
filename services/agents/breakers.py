"""An agent's circuit breakers, one per remote operation, and what operators see of them.

Each state change sets the `orderflow_circuit_state` gauge. An *opening* lasts from the moment a
closed circuit opens until it is closed again: a failed trial call (half-open, then open again)
does not start a new one, because for an operator the endpoint has been failing all along. An
opening that lasts longer than `circuit_alert_after_s` is reported once (a `circuit-open` alert
whose id names the operation and the opening time).

What an operator reads of an open circuit is orderflow's text, one for the whole opening:
`circuit open: payment.charge unavailable since <time>`. pybreaker has three texts for it
("Failures threshold reached…" from the call that trips it, "Timeout not elapsed yet…" from
every call refused, "Trial call failed…"), which made one outage two or three failure groups
in `orderflow orders list --group-by error`; `Circuit` raises `CircuitOpen` instead.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta

import pybreaker

from shared import clock
from shared.errors import PermanentError
from shared.metrics import CIRCUIT_STATE

STATE_VALUE = {pybreaker.STATE_CLOSED: 0, pybreaker.STATE_OPEN: 1, pybreaker.STATE_HALF_OPEN: 2}
"""The gauge's encoding of a breaker's state."""


class ClockedStorage(pybreaker.CircuitMemoryStorage):
    """A breaker's state, its opening timed by our clock (shared/clock.py), not the host's:
    pybreaker compares `opened_at` with the host's time, so this answers the host's time less
    what our monotonic clock says has passed since the opening. On a real host that is when it
    opened; in a simulation, virtual time decides when an open circuit lets a trial through."""

    def __init__(self) -> None:
        super().__init__(pybreaker.STATE_CLOSED)
        self._opened: float | None = None

    @property
    def opened_at(self) -> datetime | None:
        if self._opened is None:
            return None
        return datetime.now(UTC) - timedelta(seconds=clock.monotonic() - self._opened)

    @opened_at.setter
    def opened_at(self, _: datetime) -> None:
        self._opened = clock.monotonic()


class CircuitOpen(pybreaker.CircuitBreakerError):
    """A call refused (or a failure that opened the circuit) by an open circuit breaker."""

    def __init__(self, operation: str, since: datetime | None) -> None:
        when = since.astimezone(UTC).isoformat(timespec="seconds") if since else "just now"
        super().__init__(f"circuit open: {operation} unavailable since {when}")
        self.operation = operation
        self.since = since


class Circuit(pybreaker.CircuitBreaker):
    """pybreaker's breaker, whose open-circuit errors are `CircuitOpen`, in orderflow's words."""

    def __init__(self, *, since: Callable[[], datetime | None], **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self._since = since

    @contextmanager
    def calling(self) -> Iterator[None]:
        try:
            with super().calling():
                yield
        except CircuitOpen:
            raise
        except pybreaker.CircuitBreakerError as exc:
            # The failure that tripped it stays the cause (a traceback, a debugger).
            raise CircuitOpen(str(self.name), self._since()) from (exc.__cause__ or exc.__context__)


class Breakers(pybreaker.CircuitBreakerListener):
    def __init__(self, *, fail_max: int, reset_s: float) -> None:
        self._fail_max = fail_max
        self._reset_s = reset_s
        self._breakers: dict[str, pybreaker.CircuitBreaker] = {}
        self._opened_at: dict[str, datetime] = {}
        """Operations whose circuit is not closed, and since when."""
        self._last_opened: dict[str, float] = {}
        """`clock.monotonic()` when each circuit last went open (a failed trial included)."""

    def get(self, operation: str) -> pybreaker.CircuitBreaker:
        if operation not in self._breakers:
            self._breakers[operation] = Circuit(
                since=lambda: self._opened_at.get(operation),
                fail_max=self._fail_max,
                reset_timeout=self._reset_s,
                exclude=[PermanentError],
                listeners=[self],
                state_storage=ClockedStorage(),
                name=operation,
            )
            CIRCUIT_STATE.labels(operation).set(0)
        return self._breakers[operation]

    def state_change(
        self,
        cb: pybreaker.CircuitBreaker,
        old_state: pybreaker.CircuitBreakerState | None,
        new_state: pybreaker.CircuitBreakerState,
    ) -> None:
        operation = str(cb.name)
        CIRCUIT_STATE.labels(operation).set(STATE_VALUE.get(new_state.name, 1))
        if new_state.name == pybreaker.STATE_OPEN:
            self._last_opened[operation] = clock.monotonic()
        if new_state.name == pybreaker.STATE_CLOSED:
            self._opened_at.pop(operation, None)
        else:
            # To the microsecond (the time names the opening; it is never stored as a time).
            self._opened_at.setdefault(operation, clock.now())

    def states(self) -> dict[str, str]:
        return {op: str(b.current_state) for op, b in sorted(self._breakers.items())}

    def lets_through(self, operation: str) -> bool:
        """Whether a call of `operation` would go through now: its circuit is closed or half
        open, or open with its reset time come (that call is the trial)."""
        if self.get(operation).current_state != pybreaker.STATE_OPEN:
            return True
        opened = self._last_opened.get(operation)
        return opened is None or clock.monotonic() - opened >= self._reset_s

    def open(self) -> list[str]:
        """Operations whose circuit is open (failing fast) right now."""
        return [op for op, state in self.states().items() if state == pybreaker.STATE_OPEN]

    def open_longer_than(self, after: timedelta, *, now: datetime) -> dict[str, datetime]:
        """Operations whose current opening started more than `after` ago, and when."""
        return {op: at for op, at in sorted(self._opened_at.items()) if now - at > after}
