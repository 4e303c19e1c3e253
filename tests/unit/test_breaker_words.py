"""An open circuit is one failure group, in orderflow's words (not pybreaker's three texts)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta

import pybreaker
import pytest
from tenacity import wait_none

import services.agents.calls as calls_module
from services.agents.agent import Agent
from services.agents.attempts import MemoryTickets
from services.agents.breakers import Breakers, CircuitOpen
from services.operator.explain import fingerprint
from shared import clock
from shared.broker.consumer import Delivery
from shared.config import load_settings
from shared.domain.messages import StepAction, StepReply, StepRequest
from shared.domain.timing import utcnow
from shared.errors import RemoteTransient


@dataclass
class FakeClock:
    at: float = 1_800_000_000.0

    def wall(self) -> float:
        return self.at

    def monotonic(self) -> float:
        return self.at


@pytest.fixture
def fake_clock() -> Iterator[FakeClock]:
    fake = FakeClock()
    token = clock.CLOCK.set(fake)
    try:
        yield fake
    finally:
        clock.CLOCK.reset(token)


def outage_call(breakers: Breakers, operation: str) -> str:
    """One call of an endpoint that is down: the text of the error the agent reports."""
    try:
        with breakers.get(operation).calling():
            raise RemoteTransient(f"{operation}: HTTP 503")
    except (RemoteTransient, pybreaker.CircuitBreakerError) as exc:
        return str(exc)
    raise AssertionError("the call did not fail")


def test_one_opening_is_one_text_whatever_pybreaker_says(fake_clock: FakeClock) -> None:
    breakers = Breakers(fail_max=3, reset_s=5)
    texts = [outage_call(breakers, "payment.charge") for _ in range(3)]  # the third trips it
    fake_clock.at += 1
    texts.append(outage_call(breakers, "payment.charge"))  # refused: not elapsed yet
    fake_clock.at += 10
    texts.append(outage_call(breakers, "payment.charge"))  # the trial call fails
    fake_clock.at += 1
    texts.append(outage_call(breakers, "payment.charge"))  # refused again
    assert texts[:2] == ["payment.charge: HTTP 503"] * 2
    opened = "2027-01-15T08:00:00+00:00"
    assert set(texts[2:]) == {f"circuit open: payment.charge unavailable since {opened}"}
    assert not any("threshold" in t or "Timeout" in t or "Trial" in t for t in texts)
    # One failure group (`orders list --group-by error`), for this opening and the next ones.
    assert {fingerprint(t) for t in texts[2:]} == {
        "circuit open: payment.charge unavailable since #"
    }


def test_the_error_is_still_a_circuit_breaker_error_with_its_cause(fake_clock: FakeClock) -> None:
    breakers = Breakers(fail_max=1, reset_s=5)
    with pytest.raises(CircuitOpen) as tripped, breakers.get("inventory.reserve").calling():
        raise RemoteTransient("inventory.reserve: HTTP 503")
    assert isinstance(tripped.value, pybreaker.CircuitBreakerError)  # calls.py's outcome map
    assert isinstance(tripped.value.__cause__, RemoteTransient)
    assert tripped.value.operation == "inventory.reserve"


class DownRemote:
    """A remote service in an outage: every call answers 503."""

    def __init__(self) -> None:
        self.calls = 0

    async def call(self, operation: str, **kw: object) -> dict[str, object]:
        self.calls += 1
        raise RemoteTransient(f"{operation}: HTTP 503")


class Replies:
    def __init__(self) -> None:
        self.seen: list[StepReply] = []

    async def publish(self, reply: StepReply, **kw: object) -> None:
        self.seen.append(reply)


def request_of(order: str) -> Delivery:
    request = StepRequest(
        order_id=order,
        step="charge",
        action=StepAction.DO,
        operation="payment.charge",
        fencing_token=f"{order}:1",
        idempotency_key=f"{order}:charge",
        complete_by=utcnow() + timedelta(seconds=60),
        attempts_allowed=3,
        reply_to="t.reply.x",
    )
    return Delivery(
        message=request,
        message_id=f"{order}:1:charge:1",
        correlation_id="c",
        reply_to=None,
        headers={},
        deliveries=1,
    )


async def test_the_orders_an_open_circuit_fails_make_one_failure_group() -> None:
    """The agent's replies during one outage: the orders whose attempts the open circuit ended
    all report the same words, so `orderflow orders list --group-by error` shows one group."""
    replies = Replies()
    remote = DownRemote()
    settings = load_settings(breaker_fail_max=3, breaker_reset_s=600)
    agent = Agent(
        "payment",
        remote,  # type: ignore[arg-type]
        replies,  # type: ignore[arg-type]
        settings.agents,
        hub=settings.hub,
        ticket_keep_s=settings.broker.inbox_ttl_s,
        tickets=MemoryTickets(),
    )
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(calls_module, "RETRY_WAIT", wait_none())
        # Handled at once, as an agent's prefetch does: each spends attempts, one trips the
        # circuit, the others are refused by it (pybreaker: "Timeout not elapsed yet").
        await asyncio.gather(*(agent.handle(request_of(f"o-{n}")) for n in range(1, 5)))
    errors = [reply.error_message for reply in replies.seen if reply.error_message]
    # Those that had spent attempts when the circuit opened say so; one that had not is silent.
    assert len(errors) >= 2, replies.seen
    texts = {fingerprint(error) for error in errors}
    assert texts == {"circuit open: payment.charge unavailable since #"}, errors
    assert remote.calls == 3  # the circuit opened on the third failure: no call since
