"""The one backoff of the loops that wait between tries (`shared.backoff`)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared.backoff import Backoff


@given(
    first=st.floats(0.001, 10),
    factor=st.floats(1, 100),
    tries=st.integers(1, 40),
)
def test_each_pause_doubles_up_to_the_cap_with_at_most_its_jitter(
    first: float, factor: float, tries: int
) -> None:
    cap = first * factor
    pauses = Backoff(first=first, cap=cap)
    for n in range(tries):
        base = first * 2.0**n
        pause = pauses.next()
        assert min(base, cap) <= pause <= min(base + first, cap) + 1e-9


def test_pauses_differ_between_processes_that_failed_together() -> None:
    firsts = {round(Backoff(first=1.0, cap=60.0).next(), 6) for _ in range(20)}
    assert len(firsts) > 1


def test_a_reset_starts_again_from_the_first_pause() -> None:
    pauses = Backoff(first=1.0, cap=60.0, jitter=0.0)
    assert [pauses.next() for _ in range(4)] == [1.0, 2.0, 4.0, 8.0]
    pauses.reset()
    assert pauses.next() == 1.0


@pytest.mark.parametrize(("first", "cap"), [(0.0, 1.0), (-1.0, 1.0), (2.0, 1.0)])
def test_a_backoff_that_cannot_wait_is_refused(first: float, cap: float) -> None:
    with pytest.raises(ValueError, match="first"):
        Backoff(first=first, cap=cap)
