"""Claims as values: the rows `claim` and `claim-compensation` of the transition table.

A claim takes a batch of records at once, so it is not one conditional update but a condition
every record it takes must meet (`Claim.expect`) and the changes each one gets (`Claim.changes`,
its next attempt with that attempt's instance id as the lock). Both come from the row: the
source state it expects and the target state it sets. The memory store applies a claim with
`matches` and `apply`; the PostgreSQL and MongoDB stores translate it into one statement or one
conditional write per record, and the contract suite checks that they agree.

The instance id carries the claim's `nonce`, made once per claim call: `changes` stays a pure
function of its arguments and the claim (an adapter may call it twice for one record and gets
the same lock), while a claim that a rollback took back never lends its token to the next one
(shared/domain/identity.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from shared.domain.identity import instance_id, new_nonce
from shared.domain.journal import HistoryEvent, HistoryEventType
from shared.domain.states import ProcessState
from shared.domain.transitions import Action, check_transition, transition_for
from shared.domain.updates import Changes, Expect


@dataclass(frozen=True)
class Claim:
    """Up to `limit` records that match `expect`, oldest due first, each to get `changes`."""

    action: Action
    source: ProcessState
    target: ProcessState
    now: datetime
    owner: str
    complete_by: datetime
    limit: int
    nonce: str
    """Random, one per claim call: every token this claim issues ends with it."""

    @property
    def expect(self) -> Expect:
        """In the source state, unlocked, and due by the claim's time."""
        return Expect(process_state=frozenset({self.source}), locked_by=None, due_by=self.now)

    @property
    def fields(self) -> dict[str, Any]:
        """What every claimed record gets: the target state, the owner, the deadline, the time."""
        return {
            "process_state": self.target,
            "owner": self.owner,
            "complete_by": self.complete_by,
            "updated_at": self.now,
        }

    def changes(self, order_id: str, attempt: int) -> Changes:
        """What a claimed record, now at `attempt`, becomes: `fields`, and its next attempt
        locked by that attempt's instance id (which fences every later write of it)."""
        following = attempt + 1
        lock = {"attempt": following, "locked_by": instance_id(order_id, following, self.nonce)}
        return Changes(fields={**self.fields, **lock})

    def started(self, order_id: str, attempt: int, *, by: str) -> HistoryEvent:
        """The `ExecutionStarted` event of a record claimed at `attempt` (before the claim):
        what a claim carries into the record's history when asked (`claim(started_by=…)`)."""
        following = attempt + 1
        return HistoryEvent(
            order_id=order_id,
            type=HistoryEventType.EXECUTION_STARTED,
            at=self.now,
            attempt=following,
            instance_id=instance_id(order_id, following, self.nonce),
            data={"by": by},
        )


def _claim(
    action: Action, *, now: datetime, limit: int, owner: str, complete_by: datetime
) -> Claim:
    row = transition_for(action)
    [source] = row.sources
    [target] = row.targets
    assert source is not None  # a claim takes existing records (only submission creates)
    check_transition(action, source, target)
    return Claim(action, source, target, now, owner, complete_by, limit, new_nonce())


def claim_orders(*, now: datetime, limit: int, owner: str, complete_by: datetime) -> Claim:
    """A scheduler's starter takes due, unlocked Pending orders, one new attempt each, with a
    deadline from the start (an attempt that dies before its first step is still recovered)."""
    return _claim(Action.CLAIM, now=now, limit=limit, owner=owner, complete_by=complete_by)


def claim_compensations(*, now: datetime, limit: int, owner: str, complete_by: datetime) -> Claim:
    """A compensator takes due, unlocked Compensating orders, one new attempt each (they stay
    Compensating)."""
    return _claim(
        Action.CLAIM_COMPENSATION, now=now, limit=limit, owner=owner, complete_by=complete_by
    )


def claim_for(
    *, now: datetime, limit: int, owner: str, complete_by: datetime, compensating: bool
) -> Claim:
    """The claim the store port's `claim(..., compensating=...)` asks for."""
    build = claim_compensations if compensating else claim_orders
    return build(now=now, limit=limit, owner=owner, complete_by=complete_by)
