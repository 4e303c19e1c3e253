"""An agent's allowance holds however often the consumer runs its handling (issue 14).

Real components: the real consumer on the real RabbitMQ, the inbox and the attempt tickets on
the real PostgreSQL, the real agent, and the remote stand-in over real HTTP, which counts every
call it is asked (`GET /attempts`). Every call fails transiently, so a handling spends all it
may. The consumer runs a handling again in place after a store outage, and again later after an
unexpected exception (a copy set aside in the retry queue); each time the remote service must
see no more calls than the request's allowance, and the reply must report every attempt spent
(a reply that reported fewer would give the scheduler back budget that was spent). The third
layer, a request delivered again after its agent died, is tests/system/test_retry_budget.py.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from services.agents.agent import Agent
from services.agents.attempts import InboxTickets
from shared.broker.consumer import Delivery
from shared.broker.private import PrivateQueue
from shared.config import load_settings
from shared.domain.coordination import InboxOutcome
from shared.domain.messages import StepAction, StepOutcome, StepReply, StepRequest
from shared.domain.states import ErrorKind
from shared.domain.timing import utcnow
from shared.errors import RemoteTransient, StoreUnavailable
from shared.remote.client import RemoteClient
from tests.support.broker_harness import Broker
from tests.support.remote_service import InProcessRemote, signature
from tests.support.waiting import eventually

pytestmark = [pytest.mark.rabbitmq, pytest.mark.postgres]

ALLOWED = 3


class Rig:
    def __init__(self, broker: Broker, remote: InProcessRemote, hub: str) -> None:
        self.broker = broker
        self.remote = remote
        self.queue = broker.names.agent("payment")
        self.settings = load_settings(hub=hub, breaker_fail_max=100)
        self.replies: list[StepReply] = []
        self.client = remote.agent_client(account=hub)

    async def start(self) -> None:
        self.reply_queue = PrivateQueue(
            self.broker.connection,
            self.broker.names.reply_queue("budget-test"),
            lambda contract, message: self.replies.append(contract),
            max_bytes=65536,
        )
        await self.reply_queue.start()

    async def stop(self) -> None:
        await self.reply_queue.stop()
        await self.client.close()

    def agent(self, *, client: Any = None, store: Any = None, along: bool = False) -> Agent:
        """`along`: the agent asks for each request's first ticket with its inbox claim (its
        consumer must be given `agent.along`, as `serve_agent` does)."""
        tickets = InboxTickets(store or self.broker.store, self.queue)
        return Agent(
            "payment",
            client or self.client,
            self.broker.publisher,
            self.settings.agents,
            hub=self.settings.hub,
            ticket_keep_s=self.settings.broker.inbox_ttl_s,
            tickets=tickets,
            ticket_queue=tickets.queue if along else None,
        )

    async def ask(self, order_id: str) -> None:
        request = StepRequest(
            order_id=order_id,
            step="charge",
            action=StepAction.DO,
            operation="payment.charge",
            fencing_token=f"{order_id}:1",
            fencing_signature=signature(self.settings.hub, f"{order_id}:1"),
            idempotency_key=f"{order_id}:charge",
            complete_by=utcnow() + timedelta(seconds=30),
            attempts_allowed=ALLOWED,
            payload={"amount_cents": 500},
            reply_to=self.reply_queue.name,
        )
        await self.broker.publisher.publish(
            request,
            exchange=self.broker.names.exchange,
            routing_key=self.queue,
            message_id=f"{order_id}:1:charge:1",
        )

    async def calls(self, order_id: str) -> int:
        return len(await self.client.attempts(order_id=order_id))

    async def replies_to(self, order_id: str, at_least: int) -> list[StepReply]:
        async def arrived() -> list[StepReply] | None:
            mine = [r for r in self.replies if r.order_id == order_id]
            return mine if len(mine) >= at_least else None

        replies: list[StepReply] = await eventually(
            arrived, timeout=20, what=f"{at_least} replies to {order_id}"
        )
        return replies


@pytest.fixture
async def rig(broker: Broker, tmp_path: Path, hub: str) -> AsyncIterator[Rig]:
    remote = InProcessRemote(tmp_path / "ledger.sqlite3", accounts=(hub,))
    await remote.start(transient_error_rate=1.0)
    r = Rig(broker, remote, hub)
    await r.start()
    try:
        yield r
    finally:
        await r.stop()
        await remote.stop()


def assert_within_allowance(calls: int, replies: list[StepReply]) -> None:
    assert calls <= ALLOWED, f"{calls} remote calls for a request allowed {ALLOWED}"
    for reply in replies:
        assert (reply.outcome, reply.error_kind) == (StepOutcome.ERROR, ErrorKind.TRANSIENT)
        assert calls <= reply.attempts_used <= ALLOWED, (
            f"the reply reports {reply.attempts_used} attempts; {calls} calls were made"
        )


@pytest.mark.parametrize("along", [False, True], ids=["ticket-alone", "ticket-along"])
async def test_a_handling_run_again_after_a_store_outage_spends_nothing_more(
    rig: Rig, along: bool
) -> None:
    """The consumer holds a message whose handler raised an outage and runs the handler again
    in place. Here the outage strikes after the calls, as it would for any store write the
    handling makes after them: the second run must find the allowance spent, also when its
    first ticket is asked for with its claim again
    (decision:first-attempt-ticket-with-inbox-claim)."""
    agent = rig.agent(along=along)
    struck: list[str] = []

    async def handler(delivery: Delivery) -> None:
        await agent.handle(delivery)
        if not struck:
            struck.append(delivery.message_id)
            raise StoreUnavailable("the store went away after the calls")

    await rig.broker.consume(rig.queue, handler, along=agent.along if along else None)
    await rig.ask("o-held")
    replies = await rig.replies_to("o-held", 2)  # one per run of the handler
    assert struck, "the outage struck"
    assert_within_allowance(await rig.calls("o-held"), replies)
    assert "earlier handling" in (replies[-1].error_message or "")


class LosesAnAnswer:
    """The store for the tickets: the second ticket's write lands, then its answer is lost
    (the connection drops after the commit), which the consumer holds as an outage."""

    def __init__(self, store: Any) -> None:
        self._store = store
        self.tickets = 0

    async def inbox_claim_many(self, queue: str, claims: Any, **kw: Any) -> list[InboxOutcome]:
        outcomes: list[InboxOutcome] = await self._store.inbox_claim_many(queue, claims, **kw)
        self.tickets += len(claims)
        if self.tickets == 2:
            raise StoreUnavailable("connection lost after the ticket's write")
        return outcomes


async def test_a_ticket_whose_answer_was_lost_counts_as_spent(rig: Rig) -> None:
    """The agent's own store write fails between two calls; the consumer runs the handling
    again, which finds both tickets taken (one by a run that made no call with it)."""
    store = LosesAnAnswer(rig.broker.store)
    await rig.broker.consume(rig.queue, rig.agent(store=store).handle)
    await rig.ask("o-lost")
    [reply] = await rig.replies_to("o-lost", 1)
    calls = await rig.calls("o-lost")
    assert store.tickets > 2, "the handling ran again after the outage"
    assert_within_allowance(calls, [reply])
    assert (calls, reply.attempts_used) == (ALLOWED - 1, ALLOWED), "the lost ticket is spent"


class BuggyOnce:
    """The real client, whose first answer the handling never gets: a bug raises instead."""

    def __init__(self, client: RemoteClient) -> None:
        self._client = client
        self.raised = False

    async def call(self, operation: str, **kw: Any) -> dict[str, Any]:
        if self.raised:
            return await self._client.call(operation, **kw)
        self.raised = True
        with contextlib.suppress(RemoteTransient):
            await self._client.call(operation, **kw)
        raise RuntimeError("a bug in the handling, after its first call")


async def test_a_handling_run_again_after_an_unexpected_exception_spends_what_is_left(
    rig: Rig,
) -> None:
    """An unexpected exception sets the message aside (the retry queue); its copy comes back
    and is handled again, with the allowance the first run left."""
    client = BuggyOnce(rig.client)
    await rig.broker.consume(rig.queue, rig.agent(client=client).handle, retry_delay=0.2)
    await rig.ask("o-buggy")
    [reply] = await rig.replies_to("o-buggy", 1)
    assert client.raised
    calls = await rig.calls("o-buggy")
    assert_within_allowance(calls, [reply])
    assert calls == ALLOWED


async def test_every_run_of_a_handling_shares_one_allowance_when_runs_overlap(rig: Rig) -> None:
    """Two handlings of one request at once (a claim that expired while its holder still
    worked: the inbox lets another take it over) still share one allowance."""
    agent = rig.agent()
    request = StepRequest(
        order_id="o-twice",
        step="charge",
        action=StepAction.DO,
        operation="payment.charge",
        fencing_token="o-twice:1",
        fencing_signature=signature(rig.settings.hub, "o-twice:1"),
        idempotency_key="o-twice:charge",
        complete_by=utcnow() + timedelta(seconds=30),
        attempts_allowed=ALLOWED,
        reply_to=rig.reply_queue.name,
    )
    delivery = Delivery(
        message=request,
        message_id="o-twice:1:charge:1",
        correlation_id=None,
        reply_to=None,
        headers={},
        deliveries=1,
    )
    await asyncio.gather(agent.handle(delivery), agent.handle(delivery))
    replies = await rig.replies_to("o-twice", 2)
    assert_within_allowance(await rig.calls("o-twice"), replies)
    assert await rig.calls("o-twice") == ALLOWED


async def test_a_requests_first_ticket_goes_with_its_inbox_claim(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """decision:first-attempt-ticket-with-inbox-claim: the agent's consumer claims a request and
    takes its first attempt ticket
    in one round trip (on PostgreSQL, one statement) instead of two in a row; the allowance
    is kept all the same."""
    rounds: list[set[tuple[str, str]]] = []
    store = rig.broker.store
    if rig.broker.kind == "rabbitmq":  # its store is PostgreSQL: count the round trips
        write = store._write_entries  # type: ignore[attr-defined]

        async def counted(calls: Any) -> Any:
            rounds.append({(c.queue, "claim" if c.claims else "done") for c in calls})
            return await write(calls)

        monkeypatch.setattr(store, "_write_entries", counted)
        monkeypatch.setattr(store, "_round_trips", None)
    agent = rig.agent(along=True)
    await rig.broker.consume(rig.queue, agent.handle, along=agent.along)
    await rig.ask("o-along")
    [reply] = await rig.replies_to("o-along", 1)
    calls = await rig.calls("o-along")
    assert_within_allowance(calls, [reply])
    assert (calls, reply.attempts_used) == (ALLOWED, ALLOWED)
    if rig.broker.kind == "rabbitmq":
        request, ticket = (rig.queue, "claim"), (f"{rig.queue}:attempts", "claim")
        assert {request, ticket} <= rounds[0], f"claim and first ticket apart: {rounds}"
        assert sum(ticket in r for r in rounds) == ALLOWED, "each ticket taken once"
