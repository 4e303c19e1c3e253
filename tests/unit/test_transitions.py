"""Every transition the table allows, and every one it refuses."""

from __future__ import annotations

import itertools

import pytest

from shared.domain.states import ProcessState
from shared.domain.transitions import TRANSITIONS, Action, check_transition, is_allowed
from shared.errors import IllegalTransition

P = ProcessState

ALLOWED = {
    (Action.SUBMIT, None, P.PENDING),
    (Action.CLAIM, P.PENDING, P.PROCESSING),
    (Action.START_STEP, P.PROCESSING, P.PROCESSING),
    (Action.COMPLETE_STEP, P.PROCESSING, P.PROCESSING),
    (Action.COMPLETE_STEP, P.PROCESSING, P.PROCESSED),
    (Action.FAIL, P.PROCESSING, P.ERROR),
    (Action.FAIL, P.PROCESSING, P.COMPENSATING),
    (Action.RECOVER, P.PROCESSING, P.PENDING),
    (Action.RECOVER, P.PROCESSING, P.ERROR),
    (Action.RECOVER, P.PROCESSING, P.COMPENSATING),
    (Action.RELEASE, P.PROCESSING, P.PENDING),
    (Action.RELEASE, P.PROCESSING, P.ERROR),
    (Action.RELEASE, P.PROCESSING, P.COMPENSATING),
    (Action.RESUBMIT, P.ERROR, P.PENDING),
    (Action.COMPENSATE, P.ERROR, P.COMPENSATING),
    (Action.COMPENSATE, P.COMPENSATION_FAILED, P.COMPENSATING),
    (Action.CLAIM_COMPENSATION, P.COMPENSATING, P.COMPENSATING),
    (Action.RECORD_UNDO, P.COMPENSATING, P.COMPENSATING),
    (Action.FINISH_COMPENSATION, P.COMPENSATING, P.COMPENSATED),
    (Action.FINISH_COMPENSATION, P.COMPENSATING, P.COMPENSATION_FAILED),
    (Action.RECOVER_COMPENSATION, P.COMPENSATING, P.COMPENSATING),
    (Action.RECOVER_COMPENSATION, P.COMPENSATING, P.COMPENSATION_FAILED),
    (Action.CANCEL, P.PENDING, P.CANCELLED),
    (Action.CANCEL_BY_COMPENSATION, P.PENDING, P.COMPENSATING),
    (Action.CANCEL_BY_COMPENSATION, P.PROCESSING, P.COMPENSATING),
    (Action.CANCEL_BY_COMPENSATION, P.ERROR, P.COMPENSATING),
}
EVERY = list(itertools.product(Action, [None, *ProcessState], ProcessState))
REFUSED = [t for t in EVERY if t not in ALLOWED]


@pytest.mark.parametrize(("action", "source", "target"), sorted(ALLOWED, key=str), ids=str)
def test_allowed(action: Action, source: ProcessState | None, target: ProcessState) -> None:
    assert is_allowed(action, source, target)
    check_transition(action, source, target)


@pytest.mark.parametrize(("action", "source", "target"), REFUSED, ids=str)
def test_refused(action: Action, source: ProcessState | None, target: ProcessState) -> None:
    assert not is_allowed(action, source, target)
    with pytest.raises(IllegalTransition):
        check_transition(action, source, target)


def test_every_action_has_exactly_one_row() -> None:
    assert sorted(row.action for row in TRANSITIONS) == sorted(Action)


def test_terminal_states_are_never_left() -> None:
    for row in TRANSITIONS:
        assert not any(s is not None and s.is_terminal for s in row.sources), row


def test_only_submission_creates_and_every_write_after_a_claim_is_fenced() -> None:
    for row in TRANSITIONS:
        assert (None in row.sources) == (row.action is Action.SUBMIT)
    fenced = {row.action for row in TRANSITIONS if row.fenced}
    assert fenced == {
        Action.START_STEP, Action.COMPLETE_STEP, Action.FAIL, Action.RECOVER, Action.RELEASE,
        Action.RECORD_UNDO, Action.FINISH_COMPENSATION, Action.RECOVER_COMPENSATION,
    }  # fmt: skip


def test_compensation_outcomes_are_never_folded_into_error() -> None:
    for row in TRANSITIONS:
        if P.COMPENSATING in row.sources:
            assert P.ERROR not in row.targets
