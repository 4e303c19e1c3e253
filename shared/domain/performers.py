"""Which function performs each row of the transition table: exactly one each.

Every state change is built by the function its row names here, and by no other: the unit tests
try each one from every state and prove it moves only from its row's sources to its row's
targets and fences exactly as its row says (`tests/unit/test_performers.py`). The table cannot
hold this itself: these functions consult it (`check_transition`), so it is imported before
them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

from shared.domain.cancellation import cancel_at_once, cancel_by_compensation
from shared.domain.claims import claim_compensations, claim_orders
from shared.domain.compensation import finish_compensation, record_undo, recover_compensation
from shared.domain.operator_actions import request_compensation, resubmit
from shared.domain.transitions import Action
from shared.domain.updates import complete_step, fail, recover, release, start_step
from shared.domain.workflow import new_state_record

PERFORMED_BY: Mapping[Action, Callable[..., Any]] = MappingProxyType(
    {
        Action.SUBMIT: new_state_record,
        Action.CLAIM: claim_orders,
        Action.START_STEP: start_step,
        Action.COMPLETE_STEP: complete_step,
        Action.FAIL: fail,
        Action.RECOVER: recover,
        Action.RELEASE: release,
        Action.RESUBMIT: resubmit,
        Action.COMPENSATE: request_compensation,
        Action.CLAIM_COMPENSATION: claim_compensations,
        Action.RECORD_UNDO: record_undo,
        Action.FINISH_COMPENSATION: finish_compensation,
        Action.RECOVER_COMPENSATION: recover_compensation,
        Action.CANCEL: cancel_at_once,
        Action.CANCEL_BY_COMPENSATION: cancel_by_compensation,
    }
)
