"""An open circuit is one failure group, in orderflow's words (not pybreaker's three texts)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pybreaker
import pytest

from services.agents.breakers import Breakers, CircuitOpen
from services.operator.explain import fingerprint
from shared import clock
from shared.errors import RemoteTransient


@dataclass
class FakeClock:
    at: float = 1_800_000_000.0

    def wall(self) -> float:
        return self.at

    def monotonic(self) -> float:
        return self.at


@pytest.fixture
def fake_clock() -> Iterator[FakeClock]:
    fake = FakeClock()
    token = clock.CLOCK.set(fake)
    try:
        yield fake
    finally:
        clock.CLOCK.reset(token)


def outage_call(breakers: Breakers, operation: str) -> str:
    """One call of an endpoint that is down: the text of the error the agent reports."""
    try:
        with breakers.get(operation).calling():
            raise RemoteTransient(f"{operation}: HTTP 503")
    except (RemoteTransient, pybreaker.CircuitBreakerError) as exc:
        return str(exc)
    raise AssertionError("the call did not fail")


def test_one_opening_is_one_text_whatever_pybreaker_says(fake_clock: FakeClock) -> None:
    breakers = Breakers(fail_max=3, reset_s=5)
    texts = [outage_call(breakers, "payment.charge") for _ in range(3)]  # the third trips it
    fake_clock.at += 1
    texts.append(outage_call(breakers, "payment.charge"))  # refused: not elapsed yet
    fake_clock.at += 10
    texts.append(outage_call(breakers, "payment.charge"))  # the trial call fails
    fake_clock.at += 1
    texts.append(outage_call(breakers, "payment.charge"))  # refused again
    assert texts[:2] == ["payment.charge: HTTP 503"] * 2
    opened = "2027-01-15T08:00:00+00:00"
    assert set(texts[2:]) == {f"circuit open: payment.charge unavailable since {opened}"}
    assert not any("threshold" in t or "Timeout" in t or "Trial" in t for t in texts)
    # One failure group (`orders list --group-by error`), for this opening and the next ones.
    assert {fingerprint(t) for t in texts[2:]} == {
        "circuit open: payment.charge unavailable since #"
    }


def test_the_error_is_still_a_circuit_breaker_error_with_its_cause(fake_clock: FakeClock) -> None:
    breakers = Breakers(fail_max=1, reset_s=5)
    with pytest.raises(CircuitOpen) as tripped, breakers.get("inventory.reserve").calling():
        raise RemoteTransient("inventory.reserve: HTTP 503")
    assert isinstance(tripped.value, pybreaker.CircuitBreakerError)  # calls.py's outcome map
    assert isinstance(tripped.value.__cause__, RemoteTransient)
    assert tripped.value.operation == "inventory.reserve"
