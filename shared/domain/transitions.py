"""The transition table of DESIGN §4 as data, and the check every state change passes.

Each row names who acts, from which states to which, and what the conditional update must expect.
The store adapters enforce the condition; this table decides whether a change may be asked for.
Each row is performed by exactly one function, named in `shared.domain.performers.PERFORMED_BY`
(the claims too: `shared.domain.claims` builds them from their rows).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from shared.domain.states import ProcessState
from shared.errors import IllegalTransition

P = ProcessState


class Actor(StrEnum):
    SUBMISSION = "submission"
    SCHEDULER = "scheduler"
    SUPERVISOR = "supervisor"
    OPERATOR = "operator"
    COMPENSATOR = "compensator"
    CUSTOMER = "customer"


class Action(StrEnum):
    SUBMIT = "submit"
    """Insert the order and its Pending state record if absent."""
    CLAIM = "claim"
    """A scheduler's starter takes a due, unlocked Pending order for one attempt."""
    START_STEP = "start-step"
    """Mark a step Running with a fresh `complete_by`."""
    COMPLETE_STEP = "complete-step"
    """Record a step's result; the last step makes the order Processed."""
    FAIL = "fail"
    """A non-transient failure or a spent budget: park for an operator, or compensate."""
    RECOVER = "recover"
    """The supervisor releases an expired attempt, or parks the order at the failure threshold."""
    RELEASE = "release"
    """The live attempt gives its order back at once after transient failures, as a recovery
    would after the deadline (decision:transient-failures-reported-not-waited-out)."""
    RESUBMIT = "resubmit"
    """An operator sends an order in Error back to Pending."""
    COMPENSATE = "compensate"
    """An operator asks for the completed steps to be undone."""
    CLAIM_COMPENSATION = "claim-compensation"
    """A compensator takes a due, unlocked Compensating order for one attempt."""
    RECORD_UNDO = "record-undo"
    """Record the start or the outcome of one undo in the compensation log."""
    FINISH_COMPENSATION = "finish-compensation"
    """Every undo done, or one failed after its retries."""
    RECOVER_COMPENSATION = "recover-compensation"
    """The supervisor releases an expired compensation attempt so another can take it."""
    CANCEL = "cancel"
    """Its customer (or an operator for them) cancels an order none of whose steps was sent."""
    CANCEL_BY_COMPENSATION = "cancel-by-compensation"
    """Its customer cancels an order that has begun: what it did is undone."""


@dataclass(frozen=True)
class Transition:
    action: Action
    actor: Actor
    sources: frozenset[ProcessState | None]
    targets: frozenset[ProcessState]
    fenced: bool
    """True when the update must expect `locked_by` = the acting attempt's instance id."""
    condition: str


def _row(
    action: Action,
    actor: Actor,
    sources: set[ProcessState | None],
    targets: set[ProcessState],
    *,
    fenced: bool,
    condition: str,
) -> Transition:
    return Transition(action, actor, frozenset(sources), frozenset(targets), fenced, condition)


TRANSITIONS: tuple[Transition, ...] = (
    _row(Action.SUBMIT, Actor.SUBMISSION, {None}, {P.PENDING}, fenced=False,
         condition="insert if absent; an existing record is accepted only if its data match"),
    _row(Action.CLAIM, Actor.SCHEDULER, {P.PENDING}, {P.PROCESSING}, fenced=False,
         condition="locked_by is null and next_attempt_at <= now; sets locked_by=<id>:<attempt+1>"),
    _row(Action.START_STEP, Actor.SCHEDULER, {P.PROCESSING}, {P.PROCESSING}, fenced=True,
         condition="locked_by = own instance id; sets the step Running and complete_by"),
    _row(Action.COMPLETE_STEP, Actor.SCHEDULER, {P.PROCESSING}, {P.PROCESSING, P.PROCESSED},
         fenced=True, condition="locked_by = own instance id; last step -> Processed"),
    _row(Action.FAIL, Actor.SCHEDULER, {P.PROCESSING}, {P.ERROR, P.COMPENSATING}, fenced=True,
         condition="locked_by = own instance id; raises an alert"),
    _row(Action.RECOVER, Actor.SUPERVISOR, {P.PROCESSING}, {P.PENDING, P.ERROR, P.COMPENSATING},
         fenced=True, condition="locked_by = the id seen and complete_by = the expired deadline "
                                "seen; at the failure threshold -> Error + alert, or "
                                "Compensating where the workflow compensates `recovery-limit`"),
    _row(Action.RELEASE, Actor.SCHEDULER, {P.PROCESSING}, {P.PENDING, P.ERROR, P.COMPENSATING},
         fenced=True, condition="locked_by = own instance id; failure_count+1 and backoff, or "
                                "at the threshold as a recovery"),
    _row(Action.RESUBMIT, Actor.OPERATOR, {P.ERROR}, {P.PENDING}, fenced=False,
         condition="process_state and updated_at as the operator saw them"),
    _row(Action.COMPENSATE, Actor.OPERATOR, {P.ERROR, P.COMPENSATION_FAILED}, {P.COMPENSATING},
         fenced=False, condition="process_state and updated_at as the operator saw them"),
    _row(Action.CLAIM_COMPENSATION, Actor.COMPENSATOR, {P.COMPENSATING}, {P.COMPENSATING},
         fenced=False,
         condition="locked_by is null and next_attempt_at <= now; sets locked_by=<id>:<attempt+1>"),
    _row(Action.RECORD_UNDO, Actor.COMPENSATOR, {P.COMPENSATING}, {P.COMPENSATING}, fenced=True,
         condition="locked_by = own instance id"),
    _row(Action.FINISH_COMPENSATION, Actor.COMPENSATOR, {P.COMPENSATING},
         {P.COMPENSATED, P.COMPENSATION_FAILED}, fenced=True,
         condition="locked_by = own instance id; a failed undo raises an alert"),
    _row(Action.RECOVER_COMPENSATION, Actor.SUPERVISOR, {P.COMPENSATING},
         {P.COMPENSATING, P.COMPENSATION_FAILED}, fenced=True,
         condition="locked_by = the id seen and complete_by = the expired deadline; "
                   "at the failure threshold -> CompensationFailed + alert"),
    _row(Action.CANCEL, Actor.CUSTOMER, {P.PENDING}, {P.CANCELLED}, fenced=False,
         condition="process_state, locked_by and updated_at as read; no step ever sent"),
    _row(Action.CANCEL_BY_COMPENSATION, Actor.CUSTOMER, {P.PENDING, P.PROCESSING, P.ERROR},
         {P.COMPENSATING}, fenced=False,
         condition="process_state, locked_by and updated_at as read; locked_by null (the "
                   "running attempt is fenced out), due for a compensator"),
)  # fmt: skip

_BY_ACTION: dict[Action, Transition] = {row.action: row for row in TRANSITIONS}


def transition_for(action: Action) -> Transition:
    return _BY_ACTION[action]


def is_allowed(action: Action, source: ProcessState | None, target: ProcessState) -> bool:
    row = _BY_ACTION[action]
    return source in row.sources and target in row.targets


def check_transition(action: Action, source: ProcessState | None, target: ProcessState) -> None:
    """Raise `IllegalTransition` unless the table allows `action` to move `source` to `target`."""
    if not is_allowed(action, source, target):
        raise IllegalTransition(
            f"{action} may not move an order from {source or 'nothing'} to {target}"
        )
