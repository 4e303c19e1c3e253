"""The agent's allowance over any run of handlings of one request (hypothesis; memory fakes).

Each handling may be cut short as the consumer's layers would see it: an unexpected exception
after a call (set aside, handled again later), the ticket store failing before or after its
write (held, handled again in place); the request may be delivered again after a handling
ended. Whatever the remote answers, the calls never exceed the allowance, and every reply
reports at least the calls made so far (never more than the allowance).
"""

from __future__ import annotations

import contextlib
import dataclasses
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tenacity import wait_none

import services.agents.calls as calls_module
from services.agents.agent import Agent
from services.agents.attempts import MemoryTickets
from shared.broker.consumer import Delivery
from shared.config import load_settings
from shared.domain.coordination import InboxOutcome
from shared.domain.messages import StepAction, StepReply, StepRequest
from shared.domain.timing import utcnow
from shared.errors import RemoteDeclined, RemoteTransient, StoreUnavailable

Answer = str  # "ok", "transient", "declined"
Cut = str  # "none", "bug-after-call", "store-before-write", "store-after-write"


class Remote:
    def __init__(self, answers: list[Answer]) -> None:
        self._answers = answers
        self.calls = 0
        self.bug_after_next = False

    async def call(self, operation: str, **kw: Any) -> dict[str, Any]:
        answer = self._answers[self.calls % len(self._answers)]
        self.calls += 1
        if self.bug_after_next:
            self.bug_after_next = False
            raise RuntimeError("a bug after the call")
        if answer == "transient":
            raise RemoteTransient(f"{operation}: HTTP 503")
        if answer == "declined":
            raise RemoteDeclined(f"{operation} declined")
        return {"outcome": "applied", "result": {}}


class FlakyTickets(MemoryTickets):
    def __init__(self) -> None:
        super().__init__()
        self.fail_next: str | None = None

    async def take(self, request: str, number: int, **kw: Any) -> bool:
        cut, self.fail_next = self.fail_next, None
        if cut == "store-before-write":
            raise StoreUnavailable("down before the write")
        taken = await super().take(request, number, **kw)
        if cut == "store-after-write":
            raise StoreUnavailable("the answer was lost after the write")
        return taken


def claimed_along(agent: Agent, delivery: Delivery) -> dict[tuple[str, str], InboxOutcome]:
    """What the consumer's inbox claim would answer for the claims the agent asks along: each
    one a ticket, taken by the first to ask (the tickets' store, as `InboxTickets` uses it)."""
    tickets = agent._tickets
    assert isinstance(tickets, MemoryTickets)
    answers = {}
    for queue, claim in agent.along(delivery):
        request, _, number = claim.message_id.rpartition("#")
        first = (request, int(number)) not in tickets.taken
        tickets.taken.add((request, int(number)))
        answers[(queue, claim.message_id)] = InboxOutcome.CLAIMED if first else InboxOutcome.BUSY
    return answers


class Replies:
    def __init__(self, remote: Remote) -> None:
        self._remote = remote
        self.seen: list[tuple[StepReply, int]] = []

    async def publish(self, reply: StepReply, **kw: Any) -> None:
        self.seen.append((reply, self._remote.calls))


@settings(max_examples=150, deadline=None)
@given(
    allowed=st.integers(min_value=1, max_value=4),
    answers=st.lists(st.sampled_from(["ok", "transient", "declined"]), min_size=1, max_size=5),
    cuts=st.lists(
        st.sampled_from(["none", "bug-after-call", "store-before-write", "store-after-write"]),
        min_size=1,
        max_size=6,
    ),
    along=st.booleans(),
)
async def test_no_run_of_handlings_spends_beyond_the_allowance(
    allowed: int, answers: list[Answer], cuts: list[Cut], along: bool
) -> None:
    """`along`: each handling's first ticket is asked for with its inbox claim, as the
    consumer does for an agent (decision:first-attempt-ticket-with-inbox-claim), and what that claim
    answered is handed in."""
    remote = Remote(answers)
    tickets = FlakyTickets()
    replies = Replies(remote)
    settings = load_settings(breaker_fail_max=1000)
    agent = Agent(
        "payment",
        remote,  # type: ignore[arg-type]
        replies,  # type: ignore[arg-type]
        settings.agents,
        hub=settings.hub,
        ticket_keep_s=settings.broker.inbox_ttl_s,
        tickets=tickets,
        ticket_queue="payment:attempts" if along else None,
    )
    request = StepRequest(
        order_id="o-1",
        step="charge",
        action=StepAction.DO,
        operation="payment.charge",
        fencing_token="o-1:1",
        idempotency_key="o-1:charge",
        complete_by=utcnow() + timedelta(seconds=60),
        attempts_allowed=allowed,
        reply_to="t.reply.x",
    )
    delivery = Delivery(
        message=request,
        message_id="o-1:1:charge:1",
        correlation_id="c",
        reply_to=None,
        headers={},
        deliveries=1,
    )
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(calls_module, "RETRY_WAIT", wait_none())  # no pauses between attempts
        for cut in [*cuts, "none"]:  # the last handling runs to its end
            remote.bug_after_next = cut == "bug-after-call"
            tickets.fail_next = cut if cut.startswith("store") else None
            # The consumer handles it again after either: in place, later, or redelivered.
            handled = delivery
            if along:
                handled = dataclasses.replace(delivery, taken_along=claimed_along(agent, delivery))
            with contextlib.suppress(RuntimeError, StoreUnavailable):
                await agent.handle(handled)
            assert remote.calls <= allowed, f"{remote.calls} calls, allowance {allowed}"
    assert replies.seen, "the last handling replied"
    for reply, calls_before in replies.seen:
        assert calls_before <= reply.attempts_used <= allowed
