"""What an agent answers for each outcome of a step's calls."""

from __future__ import annotations

from datetime import UTC, datetime

from services.agents.calls import Outcome
from services.agents.replies import reply_of
from shared.domain.messages import ErrorKind, StepAction, StepOutcome, StepRequest
from shared.errors import RemoteDeclined, RemoteFenced

REQUEST = StepRequest(
    order_id="o-1",
    step="charge",
    action=StepAction.DO,
    operation="payment.charge",
    fencing_token="o-1:2.abcdefgh",
    idempotency_key="o-1:charge",
    complete_by=datetime(2026, 12, 1, 12, 0, tzinfo=UTC),
    attempts_allowed=3,
    payload={},
    reply_to="h.reply.s1.abc",
)


def test_a_fenced_call_is_given_back_not_failed() -> None:
    """A rolled-back claim's attempt may act first at an attempt number; the attempt that
    holds the order then meets the fence. Failing the order for it would be a spurious
    failure: it is given back, and the next claim's higher number passes."""
    reply = reply_of(REQUEST, Outcome(error=RemoteFenced("payment.charge: stale"), attempts=1))
    assert reply.outcome is StepOutcome.ERROR
    assert reply.error_kind is ErrorKind.TRANSIENT
    assert reply.error_message is not None and reply.error_message.startswith("superseded: ")


def test_a_declined_call_is_a_permanent_failure() -> None:
    reply = reply_of(REQUEST, Outcome(error=RemoteDeclined("card declined"), attempts=1))
    assert reply.error_kind is ErrorKind.PERMANENT
