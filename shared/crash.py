"""The scheduler's crash drill (`ORDERFLOW_FAULT_CRASH_AT`): die at a chosen point, as `kill -9`
would, so the fault suite can kill a scheduler exactly there rather than wherever a signal lands.
Armed once by the scheduler process from its settings; inert everywhere else.

The store adapters know nothing of it: for `claim-uncommitted` the store factory gives the
PostgreSQL store `claim_uncommitted` as the hook it calls inside a claim's transaction."""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import dataclass

from shared.domain.transitions import Action

log = logging.getLogger(__name__)

POINTS = ("claim-uncommitted", "after-claim", "after-request", "after-undo-request")


@dataclass
class _Drill:
    point: str | None = None
    after: int = 1
    reached: int = 0


_DRILL = _Drill()


def arm(point: str | None, after: int = 1) -> None:
    """Die at `point` once `after` attempts reached it (None: never)."""
    if point is not None and point not in POINTS:
        raise ValueError(f"unknown crash point {point!r}: {', '.join(POINTS)}")
    _DRILL.point, _DRILL.after, _DRILL.reached = point, after, 0


def armed(point: str) -> bool:
    return _DRILL.point == point


def crash_point(point: str, times: int = 1) -> None:
    """Count `times` attempts reaching `point`; exit at once (no cleanup, no acks, no drain, no
    commit) when the drill is armed there and the count is reached."""
    if _DRILL.point != point:
        return
    _DRILL.reached += times
    if _DRILL.reached >= _DRILL.after:
        log.critical("crash drill: exiting at %s", point)
        for handler in logging.getLogger().handlers:
            handler.flush()
        sys.stderr.flush()
        os._exit(137)


def claim_uncommitted(action: Action, claimed: int) -> None:
    """The `claim-uncommitted` point: a scheduler's claim of `claimed` orders made and not
    committed yet (called inside the claim's transaction; a compensator's claim is not it)."""
    if action is Action.CLAIM:
        crash_point("claim-uncommitted", claimed)
