"""Each row of the transition table and the one function that performs it (`PERFORMED_BY`).

For every row, the function is tried on a record in every `ProcessState`, as its actor would see
it: from the row's sources it builds an update that matches and leaves the record in one of the
row's targets; from any other state it is refused (`IllegalTransition`) or builds a condition the
record does not match. And it fences as the row says: a fenced row's update matches only a
record locked by the acting instance; an unfenced row's depends on `locked_by` only where its
condition names it (a claim: unlocked records only).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest

from shared.domain.claims import Claim
from shared.domain.models import ErrorInfo, StateRecord, StepState
from shared.domain.performers import PERFORMED_BY
from shared.domain.states import ErrorKind, ProcessState, StepStatus
from shared.domain.timing import utcnow
from shared.domain.transitions import TRANSITIONS, Action, Transition, transition_for
from shared.domain.updates import RecoveryPolicy, Update, apply, matches
from shared.domain.workflow import ORDER_WORKFLOW
from shared.errors import IllegalTransition
from tests.support.factories import order_pair

A = Action
S = timedelta(seconds=1)
NOW = utcnow()
INSTANCE = "o-1:1"
"""The acting attempt (for a recovery: the attempt the supervisor saw)."""
OTHER = "o-1:2"
ERROR = ErrorInfo(kind=ErrorKind.PERMANENT, message="declined", at=NOW)


def policy(threshold: int, *, compensate: bool = False) -> RecoveryPolicy:
    return RecoveryPolicy(threshold, lambda n: n * S, lambda record: compensate)


Performer = Callable[..., Any]
Try = Callable[[Performer, StateRecord], Any]

TRIES: dict[Action, list[Try]] = {
    A.CLAIM: [lambda f, r: f(now=NOW, limit=1, owner="s", complete_by=NOW + S)],
    A.START_STEP: [lambda f, r: f(r, "charge", instance=INSTANCE, now=NOW, timeout=S, allowance=1)],
    A.COMPLETE_STEP: [
        lambda f, r, step=step: f(
            r, ORDER_WORKFLOW, step, instance=INSTANCE, now=NOW, result={}, attempts_used=1
        )
        for step in ("reserve", "ship")  # not the last step, and the last
    ],
    A.FAIL: [
        lambda f, r, within=within: f(
            r,
            "reserve",
            instance=INSTANCE,
            now=NOW,
            error=ERROR,
            attempts_used=1,
            compensate_within=within,
        )
        for within in (None, S)  # parked, or compensated
    ],
    A.RECOVER: [
        lambda f, r, p=p: f(r, now=NOW, policy=p)
        for p in (policy(3), policy(1), policy(1, compensate=True))
    ],
    A.RELEASE: [
        lambda f, r, p=p: f(
            r, "reserve", instance=INSTANCE, now=NOW, error=ERROR, attempts_used=1, policy=p
        )
        for p in (policy(3), policy(1), policy(1, compensate=True))
    ],
    A.RESUBMIT: [lambda f, r: f(r, ORDER_WORKFLOW, now=NOW)],
    A.COMPENSATE: [lambda f, r: f(r, now=NOW)],
    A.CLAIM_COMPENSATION: [lambda f, r: f(now=NOW, limit=1, owner="s", complete_by=NOW + S)],
    A.RECORD_UNDO: [
        lambda f, r, timeout=timeout: f(
            r, "reserve", instance=INSTANCE, now=NOW, request_timeout=timeout
        )
        for timeout in (S, None)  # its request going out, and its outcome
    ],
    A.FINISH_COMPENSATION: [
        lambda f, r, failure=failure: f(r, instance=INSTANCE, now=NOW, failure=failure)
        for failure in (None, ERROR)
    ],
    A.RECOVER_COMPENSATION: [
        lambda f, r, p=p: f(r, now=NOW, policy=p) for p in (policy(3), policy(1))
    ],
    # before any step was sent (a Pending order: Cancelled at once)
    A.CANCEL: [lambda f, r: f(r.model_copy(update={"steps": fresh_steps(r)}), now=NOW, by="c")],
    A.CANCEL_BY_COMPENSATION: [lambda f, r: f(r, now=NOW, by="c")],
}


def fresh_steps(record: StateRecord) -> dict[str, StepState]:
    return {name: StepState() for name in record.steps}


CASES = [
    pytest.param(action, n, id=f"{action}-{n}")
    for action, tries in TRIES.items()
    for n in range(len(tries))
]


def seen_by(row: Transition, state: ProcessState) -> StateRecord:
    """A record in `state` as the row's actor sees it: locked by the acting attempt where the
    row is fenced, unlocked otherwise; its deadline passed, due, one step running."""
    _, record = order_pair("o-1", now=NOW - 10 * S)
    running = StepState(status=StepStatus.RUNNING, attempts=1, allowance=1, started_at=NOW - S)
    return record.model_copy(
        update={
            "process_state": state,
            "locked_by": INSTANCE if row.fenced else None,
            "complete_by": NOW - S,
            "attempt": 1,
            "next_attempt_at": NOW - S,
            "updated_at": NOW - S,
            "retry_budget": record.retry_budget.spend(1),
            "steps": {**record.steps, "reserve": running},
        }
    )


def perform(action: Action, n: int, record: StateRecord) -> Update:
    """The row's function, tried the `n`-th way on `record`: the update it asks the store for
    (for a claim, of this one record)."""
    made = TRIES[action][n](PERFORMED_BY[action], record)
    if isinstance(made, Claim):
        return Update(made.expect, made.changes(record.order_id, record.attempt))
    assert isinstance(made, Update)
    return made


def test_every_row_has_exactly_one_function_and_no_function_two_rows() -> None:
    assert sorted(PERFORMED_BY) == sorted(Action)
    assert len(set(PERFORMED_BY.values())) == len(PERFORMED_BY)
    assert sorted(TRIES) == sorted(set(Action) - {A.SUBMIT})  # submit: below


@pytest.mark.parametrize(("action", "n"), CASES)
def test_a_row_s_function_moves_only_from_its_sources_to_its_targets(
    action: Action, n: int
) -> None:
    row = transition_for(action)
    for state in ProcessState:
        record = seen_by(row, state)
        try:
            update = perform(action, n, record)
        except IllegalTransition:
            assert state not in row.sources, (state, "refused")
            continue
        if state in row.sources:
            assert matches(record, update.expect), state
            assert apply(record, update.changes).process_state in row.targets, state
        else:
            assert not matches(record, update.expect), (state, "allowed")


@pytest.mark.parametrize(
    "row", [row for row in TRANSITIONS if row.action is not A.SUBMIT], ids=lambda row: row.action
)
def test_a_row_s_function_reaches_every_target_of_its_row(row: Transition) -> None:
    reached = {
        apply(record, perform(row.action, n, record).changes).process_state
        for state in row.sources
        if state is not None
        for record in [seen_by(row, state)]
        for n in range(len(TRIES[row.action]))
    }
    assert reached == row.targets


@pytest.mark.parametrize(("action", "n"), CASES)
def test_a_row_s_function_fences_exactly_as_its_row_says(action: Action, n: int) -> None:
    row = transition_for(action)
    for state in sorted(s for s in row.sources if s is not None):
        record = seen_by(row, state)
        update = perform(action, n, record)
        holders = (INSTANCE, OTHER, None)
        matched = {
            h: matches(record.model_copy(update={"locked_by": h}), update.expect) for h in holders
        }
        if row.fenced:
            assert matched == {INSTANCE: True, OTHER: False, None: False}
        elif "locked_by is null" in row.condition:
            assert matched == {INSTANCE: False, OTHER: False, None: True}
        elif "locked_by and updated_at as read" in row.condition:
            # the customer's: whoever held it when it was read, and only that holder
            assert matched == {h: h == record.locked_by for h in holders}
        else:  # the operator's: as the record was seen, whoever holds it
            assert matched == {INSTANCE: True, OTHER: True, None: True}


def test_submission_creates_a_pending_record_that_nobody_holds() -> None:
    row = transition_for(A.SUBMIT)
    order, _ = order_pair("o-1", now=NOW)
    record = PERFORMED_BY[A.SUBMIT](order, ORDER_WORKFLOW, now=NOW, retry_budget=10, reply_to=None)
    assert row.sources == {None} and not row.fenced
    assert record.process_state in row.targets
    assert record.locked_by is None
