"""What the operator's commands say about orders."""

from __future__ import annotations

from datetime import timedelta

import pytest

from services.operator.explain import (
    current_step,
    fingerprint,
    group_failures,
    next_action,
    undo_plan,
    unselected_because,
)
from shared.config import Settings
from shared.domain.durations import human_age, parse_duration
from shared.domain.journal import CompensationEntry, UndoStatus
from shared.domain.models import ErrorInfo, StateRecord
from shared.domain.states import ErrorKind, ProcessState, StepStatus
from shared.domain.timing import utcnow
from shared.store.port import StateQuery
from tests.support.factories import order_pair

S = timedelta(seconds=1)
SETTINGS = Settings(failure_threshold=3, supervisor_interval_s=2).supervisor


def record(state: ProcessState = ProcessState.PENDING, **fields: object) -> StateRecord:
    _, r = order_pair("o-1")
    return r.model_copy(update={"process_state": state, **fields})


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90", 90), ("90s", 90), ("15m", 900), ("2h", 7200), ("1d", 86400), ("250ms", 0.25)],
)
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text).total_seconds() == seconds


@pytest.mark.parametrize("text", ["", "soon", "5y", "-3s", "1.2.3s"])
def test_bad_durations_say_what_they_accept(text: str) -> None:
    with pytest.raises(ValueError, match="try 90s"):
        parse_duration(text)


def test_ages_read_both_ways() -> None:
    now = utcnow()
    assert human_age(now - 90 * S, now) == "1m30s ago"
    assert human_age(now + 5 * S, now) == "in 5.0s"
    assert human_age(None, now) == "-"


def test_fingerprints_group_messages_that_differ_only_in_their_variables() -> None:
    a = "no reply by 2026-12-01T05:13:42.627+00:00 for ord-16d1f9fd400b8cb05c43 after 3 tries"
    b = "no reply by 2026-12-01T06:00:00.000+00:00 for ord-aaaaaaaaaaaaaaaaaaaa after 5 tries"
    assert fingerprint(a) == fingerprint(b) == "no reply by # for # after # tries"
    assert fingerprint("payment.charge declined") != fingerprint("inventory.reserve: HTTP 503")


def test_failures_group_by_kind_and_fingerprint_biggest_first() -> None:
    now = utcnow()

    def failed(order_id: str, kind: ErrorKind, message: str) -> StateRecord:
        _, r = order_pair(order_id)
        return r.model_copy(
            update={
                "process_state": ProcessState.ERROR,
                "error": ErrorInfo(kind=kind, message=message, at=now),
            }
        )

    records = [
        failed("o-1", ErrorKind.RECOVERY_LIMIT, "recovered 5 times"),
        failed("o-2", ErrorKind.RECOVERY_LIMIT, "recovered 6 times"),
        failed("o-3", ErrorKind.PERMANENT, "declined"),
        record(),  # no error: not a failure
    ]
    groups = group_failures(records)
    assert [(g.kind, g.fingerprint, g.count) for g in groups] == [
        ("recovery-limit", "recovered # times", 2),
        ("permanent", "declined", 1),
    ]
    assert groups[0].order_ids == ["o-1", "o-2"]
    assert groups[0].view().states == {"Error": 2}


def test_the_current_step_is_the_first_not_completed() -> None:
    r = record()
    assert current_step(r) == "reserve"
    done = r.steps["reserve"].model_copy(update={"status": StepStatus.COMPLETED})
    assert current_step(r.model_copy(update={"steps": {**r.steps, "reserve": done}})) == "charge"
    all_done = {name: done for name in r.steps}
    assert current_step(r.model_copy(update={"steps": all_done})) is None


def test_next_action_for_every_state() -> None:
    now = utcnow()
    assert "due now" in next_action(record(next_attempt_at=now - S), SETTINGS, now)
    backing = record(next_attempt_at=now + 30 * S, failure_count=2)
    assert "in 30.0s (backing off after 2 failure(s))" in next_action(backing, SETTINGS, now)
    running = record(
        ProcessState.PROCESSING,
        locked_by="o-1:1",
        owner="sched-a",
        attempt=1,
        complete_by=now + 10 * S,
    )
    said = next_action(running, SETTINGS, now)
    assert "sched-a" in said and "release it for another attempt (failure 1 of 3)" in said
    last = running.model_copy(update={"failure_count": 2, "complete_by": now - 5 * S})
    said = next_action(last, SETTINGS, now)
    assert "deadline passed 5.0s ago" in said and "park it in Error" in said
    compensating = last.model_copy(update={"process_state": ProcessState.COMPENSATING})
    assert "CompensationFailed" in next_action(compensating, SETTINGS, now)
    error = record(ProcessState.ERROR)
    assert "orderflow orders resubmit o-1" in next_action(error, SETTINGS, now)
    failed = record(ProcessState.COMPENSATION_FAILED)
    assert "orderflow orders compensate o-1" in next_action(failed, SETTINGS, now)
    assert "nothing more" in next_action(record(ProcessState.PROCESSED), SETTINGS, now)


def test_the_undo_plan_runs_newest_first_and_skips_done_undos() -> None:
    now = utcnow()
    log = [
        CompensationEntry(
            order_id="o-1",
            step=step,
            undo=undo,
            idempotency_key=f"o-1:{step}:undo",
            recorded_at=now,
            status=status,
        )
        for step, undo, status in [
            ("reserve", "inventory.release", UndoStatus.PENDING),
            ("charge", "payment.refund", UndoStatus.DONE),
            ("ship", "shipping.cancel", UndoStatus.FAILED),
        ]
    ]
    plan = undo_plan(log)
    assert [(u.step, u.will_run) for u in plan] == [
        ("ship", True),
        ("charge", False),
        ("reserve", True),
    ]
    assert plan[0].idempotency_key == "o-1:ship:undo"


def test_a_selected_order_is_checked_against_its_query_again() -> None:
    now = utcnow()
    error = ErrorInfo(kind=ErrorKind.RECOVERY_LIMIT, message="recovered 2 times", at=now)
    parked = record(ProcessState.ERROR, error=error, updated_at=now - 3 * S)
    query = StateQuery(
        states=frozenset({ProcessState.ERROR}),
        changed_before=now - 2 * S,
        error_kind=ErrorKind.RECOVERY_LIMIT,
    )
    assert unselected_because(parked, query, "reserve") is None
    assert unselected_because(parked, StateQuery(), None) is None
    pending = parked.model_copy(update={"process_state": ProcessState.PENDING, "error": None})
    assert unselected_because(pending, query, None) == "state Pending, not Error"
    declined = error.model_copy(update={"kind": ErrorKind.PERMANENT})
    assert (
        unselected_because(parked.model_copy(update={"error": declined}), query, None)
        == "error kind permanent, not recovery-limit"
    )
    assert (
        unselected_because(parked.model_copy(update={"error": None}), query, None)
        == "no error, not recovery-limit"
    )
    recent = parked.model_copy(update={"updated_at": now - S})
    assert "--older-than" in (unselected_because(recent, query, None) or "")
    assert unselected_because(parked, query, "charge") == "at step reserve, not charge"
