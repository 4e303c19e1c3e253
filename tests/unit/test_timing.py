from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import pytest

from shared.domain.identity import attempt_of, instance_id, parse_instance_id
from shared.domain.timing import deadline, is_expired, recovery_backoff, utcnow

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
S = timedelta(seconds=1)


@pytest.mark.parametrize(
    ("order_id", "attempt", "nonce", "expected"),
    [("o-1", 1, "n0nce_-A", "o-1:1.n0nce_-A"), ("a.b_c", 12, "x", "a.b_c:12.x")],
)
def test_instance_id_round_trips(order_id: str, attempt: int, nonce: str, expected: str) -> None:
    assert instance_id(order_id, attempt, nonce) == expected
    assert parse_instance_id(expected) == (order_id, attempt)


@pytest.mark.parametrize(
    "bad", ["o-1", "o-1:", ":3", "o-1:x", "o-1:1.", "o-1:1.a.b", "o-1:1.a b", "o-1:.ab"]
)
def test_parse_instance_id_refuses_what_is_not_one(bad: str) -> None:
    with pytest.raises(ValueError):
        parse_instance_id(bad)


@pytest.mark.parametrize(
    ("token", "attempt"),
    [
        ("o-1:3", 3),
        ("shop/o-1:2", 2),
        ("o-1:4.Zq9_-x0A", 4),
        ("f-1", 0),
        (":3", 0),
        ("o-1:x", 0),
        ("o-1:\u00b2", 0),
        ("o-1:3.", 0),
    ],
)
def test_the_remote_service_reads_a_fencing_tokens_attempt_by_the_same_parser(
    token: str, attempt: int
) -> None:
    """A token that is not an instance id names attempt 0, which any fence refuses (a
    superscript digit, which `str.isdigit` takes and `int` refuses, included)."""
    assert attempt_of(token) == attempt


def test_attempts_are_numbered_from_one() -> None:
    with pytest.raises(ValueError):
        instance_id("o", 0, "n")


def test_deadline_and_expiry() -> None:
    assert deadline(T0, 10 * S) == T0 + 10 * S
    with pytest.raises(ValueError):
        deadline(T0, timedelta(0))
    assert is_expired(T0, T0)
    assert not is_expired(T0 + S, T0)
    assert not is_expired(None, T0)


def test_utcnow_is_aware_and_millisecond_precise() -> None:
    now = utcnow()
    assert now.tzinfo is not None
    assert now.microsecond % 1000 == 0


class Fixed(random.Random):
    def __init__(self, value: float) -> None:
        super().__init__()
        self._value = value

    def random(self) -> float:
        return self._value


POLICY = {"base": S, "cap": 30 * S, "cooldown_after": 6, "cooldown": 300 * S}


@pytest.mark.parametrize(
    ("failures", "low", "high"),
    [(1, 0.5, 1), (2, 1, 2), (3, 2, 4), (5, 8, 16), (6, 15, 30)],
)
def test_backoff_grows_exponentially_with_equal_jitter(
    failures: int, low: float, high: float
) -> None:
    assert recovery_backoff(failures, rng=Fixed(0.0), **POLICY) == low * S
    assert recovery_backoff(failures, rng=Fixed(1.0), **POLICY) == high * S


def test_backoff_is_capped_and_cools_down_past_the_count() -> None:
    assert recovery_backoff(6, rng=Fixed(1.0), **POLICY) == 30 * S
    assert recovery_backoff(7, rng=Fixed(0.3), **POLICY) == 300 * S


def test_backoff_needs_a_failure() -> None:
    with pytest.raises(ValueError):
        recovery_backoff(0, **POLICY)
