"""`orderflow audit`'s retry budget (violation 6) and effects made after their undo (2), on
what the remote service reports: pure, no server."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from services.operator.invariants import (
    BUDGET,
    AuditReport,
    _effects_after_undo,
    check_retry_budget,
)
from shared.domain.journal import HistoryEvent, HistoryEventType
from shared.domain.models import StateRecord
from shared.domain.timing import utcnow
from tests.support.factories import order_pair

FORWARD = ("inventory.reserve", "payment.charge", "shipping.create")
UNDOS = ("inventory.release", "payment.refund", "shipping.cancel")


def state(budget: int) -> StateRecord:
    _, record = order_pair("o-1", retry_budget=budget)
    return record


def event(kind: HistoryEventType) -> HistoryEvent:
    return HistoryEvent(order_id="o-1", type=kind, at=utcnow())


SUBMITTED = event(HistoryEventType.ORDER_SUBMITTED)
RESUBMITTED = event(HistoryEventType.RESUBMITTED)


def attempt(operation: str, token: str = "o-1:1") -> dict[str, Any]:
    return {"order_id": "o-1", "operation": operation, "fencing_token": token}


def violations(
    record: StateRecord,
    events: list[HistoryEvent],
    attempts: list[dict[str, Any]],
    undo_attempts: int | None = 3,
) -> list[str]:
    report = AuditReport()
    check_retry_budget(report, record, events, attempts, undo_attempts)
    assert all(v["invariant"] == BUDGET and v["order_id"] == "o-1" for v in report.violations)
    return [v["message"] for v in report.violations]


def test_forward_attempts_within_the_budget_pass_and_one_more_is_reported() -> None:
    calls = [attempt("inventory.reserve")] * 2 + [attempt("payment.charge")] * 2
    assert violations(state(4), [SUBMITTED], calls) == []
    [message] = violations(state(4), [SUBMITTED], [*calls, attempt("shipping.create")])
    assert message == (
        "5 remote attempts (inventory.reserve 2, payment.charge 2, shipping.create 1) beyond "
        "its retry budget of 4"
    )


def test_each_resubmit_grants_a_fresh_budget() -> None:
    calls = [attempt("payment.charge")] * 7
    assert violations(state(4), [SUBMITTED, RESUBMITTED], calls) == []
    [message] = violations(state(3), [SUBMITTED, RESUBMITTED], calls)
    assert message.endswith("beyond its retry budget of 6 (2 grants of 3)")


def test_an_expired_journal_leaves_forward_attempts_unchecked_but_not_undos() -> None:
    calls = [attempt("payment.charge")] * 9 + [attempt("payment.refund", "o-1:4")] * 4
    [message] = violations(state(4), [], calls)
    assert message == (
        "4 attempts of payment.refund by o-1:4, beyond the 3 one undo request may spend"
    )


def test_a_history_cut_by_its_bound_leaves_forward_attempts_unchecked() -> None:
    """MongoDB keeps an order's newest events (decision:mongodb-transition-one-write): its early
    Resubmitted events may
    be gone, so the grants cannot be counted from what is left (a false breach otherwise)."""
    calls = [attempt("payment.charge")] * 9
    cut = [RESUBMITTED.model_copy(update={"seq": 51})]
    assert violations(state(4), cut, calls) == []
    whole = [SUBMITTED.model_copy(update={"seq": 1}), RESUBMITTED.model_copy(update={"seq": 2})]
    assert len(violations(state(4), whole, calls)) == 1


def test_undos_do_not_draw_on_the_budget_and_count_per_undo_request() -> None:
    forward = [attempt("payment.charge")] * 2
    undos = [attempt("payment.refund", "o-1:1")] * 3 + [attempt("payment.refund", "o-1:2")] * 3
    undos += [attempt("inventory.release", "o-1:2")] * 3
    assert violations(state(2), [SUBMITTED], forward + undos) == []
    assert violations(state(2), [SUBMITTED], forward + undos, undo_attempts=None) == []
    assert len(violations(state(2), [SUBMITTED], forward + undos, undo_attempts=2)) == 3


@given(
    budget=st.integers(min_value=0, max_value=6),
    resubmits=st.integers(min_value=0, max_value=3),
    calls=st.lists(st.sampled_from(FORWARD + UNDOS), max_size=30),
)
def test_the_budget_check_reports_exactly_the_forward_calls_past_every_grant(
    budget: int, resubmits: int, calls: list[str]
) -> None:
    events = [SUBMITTED] + [RESUBMITTED] * resubmits
    found = violations(state(budget), events, [attempt(op) for op in calls], undo_attempts=None)
    forward = sum(1 for op in calls if op in FORWARD)
    assert bool(found) == (forward > budget * (1 + resubmits))


def effect(seq: int, operation: str, outcome: str = "applied") -> dict[str, Any]:
    return {"seq": seq, "order_id": "o-1", "operation": operation, "outcome": outcome}


def test_an_effect_made_after_its_undo_is_reported() -> None:
    record = state(10)
    assert (
        _effects_after_undo(record, [effect(1, "payment.charge"), effect(2, "payment.refund")])
        == []
    )
    late = [effect(1, "payment.refund", "noop"), effect(2, "payment.charge")]
    assert _effects_after_undo(record, late) == [
        "payment.charge applied (seq 2) after its undo payment.refund was recorded (noop, "
        "seq 1): an effect with no undo"
    ]
    declined = [effect(1, "payment.refund", "noop"), effect(2, "payment.charge", "declined")]
    assert _effects_after_undo(record, declined) == [], "a decline is no effect"
