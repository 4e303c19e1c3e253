"""The nemesis's schedule: the seed alone decides it, and it draws from the whole catalogue."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from services.nemesis.schedule import CATALOGUE, CLOCKED, KILLABLE, Kind, draw

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
