"""The nemesis's schedule: the seed alone decides it, and it draws from the whole catalogue; and
the striker has a way to strike each fault."""

from __future__ import annotations

import asyncio
import time
from typing import Any, cast

from hypothesis import given
from hypothesis import strategies as st

from harness.nemesis.schedule import CATALOGUE, CLOCKED, KILLABLE, Fault, Kind, draw
from harness.nemesis.strikes import Striker

seeds = st.integers(min_value=0, max_value=2**63)


@given(seed=seeds, faults=st.integers(min_value=0, max_value=60))
def test_the_same_seed_gives_the_same_schedule(seed: int, faults: int) -> None:
    first = draw(seed, faults, span_s=30, clock_skew_s=1)
    assert first == draw(seed, faults, span_s=30, clock_skew_s=1)
    assert len(first) == faults
    assert [f.at_s for f in first] == sorted(f.at_s for f in first)


@given(seed=seeds, faults=st.integers(min_value=len(CATALOGUE), max_value=60))
def test_enough_faults_try_every_kind_within_their_bounds(seed: int, faults: int) -> None:
    schedule = draw(seed, faults, span_s=30, clock_skew_s=1.5)
    assert {f.kind for f in schedule} == set(CATALOGUE)
    for fault in schedule:
        assert 0 <= fault.at_s <= 30 and 0 <= fault.duration_s <= 6
        if fault.kind is Kind.KILL:
            assert fault.target in KILLABLE
        if fault.kind is Kind.CLOCK_JUMP:
            assert fault.target in CLOCKED and abs(fault.amount) <= 3.0
        if fault.kind is Kind.REMOTE_HANGS:
            assert 0 < fault.amount < 1
        assert fault.describe().startswith(f"t+{fault.at_s:5.1f}s {fault.kind}")


def test_different_seeds_give_different_schedules() -> None:
    schedules = {tuple(draw(seed, 9, span_s=30, clock_skew_s=1)) for seed in range(50)}
    assert len(schedules) == 50


class Fleet:
    """What the striker asks of the fleet of processes, recorded."""

    def __init__(self) -> None:
        self.restarts: list[tuple[str, dict[str, str] | None]] = []

    def restart(self, label: str, env: dict[str, str] | None = None) -> None:
        self.restarts.append((label, env))


def striker(fleet: Fleet) -> Striker:
    absent: Any = None  # the servers and the remote service: these strikes do not reach them
    return Striker(
        seed=7,
        hub="h",
        fleet=cast(Any, fleet),
        pg=absent,
        mq=absent,
        remote=absent,
        calm_hang_rate=0.02,
    )


def test_the_nemesis_has_a_strike_for_every_kind_of_fault() -> None:
    assert set(striker(Fleet())._strikes) == set(CATALOGUE)


def test_duplicates_and_late_replies_restart_their_target_with_a_drill_for_the_duration() -> None:
    fleet = Fleet()
    strikes = striker(fleet)
    now = time.monotonic()
    duplicates = Fault(at_s=0, kind=Kind.DUPLICATES, duration_s=0, target="scheduler-1")
    late = Fault(at_s=0, kind=Kind.LATE_REPLIES, duration_s=0, target="payment-1")
    asyncio.run(strikes.strike(duplicates, now))
    asyncio.run(strikes.strike(late, now))
    assert not strikes.unapplied
    assert fleet.restarts == [
        ("scheduler-1", {"ORDERFLOW_FAULT_DUPLICATE_RATE": "0.5", "ORDERFLOW_FAULT_SEED": "7"}),
        ("scheduler-1", None),
        (
            "payment-1",
            {
                "ORDERFLOW_FAULT_REPLY_DELAY_RATE": "0.5",
                "ORDERFLOW_FAULT_REPLY_DELAY_MS": "3000",
                "ORDERFLOW_FAULT_SEED": "7",
            },
        ),
        ("payment-1", None),
    ]


def test_a_fault_that_cannot_be_struck_is_noted_as_unapplied() -> None:
    strikes = striker(Fleet())
    kill = Fault(at_s=0, kind=Kind.KILL, duration_s=0, target="payment-1")
    asyncio.run(strikes.strike(kill, time.monotonic()))  # this fleet cannot kill
    assert len(strikes.unapplied) == 1 and "could not apply" in strikes.unapplied[0]
