"""Contract: the remote service and an agent, in-process, over real HTTP and the real RabbitMQ."""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from collections.abc import AsyncIterator, Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from harness.remote.ledger import Ledger
from services.agents.agent import Agent
from services.agents.attempts import MemoryTickets
from shared.broker.consumer import Delivery
from shared.broker.private import PrivateQueue
from shared.broker.publisher import Publisher
from shared.broker.rabbitmq import connect
from shared.broker.topology import Names, QueuePolicy, declare_topology, delete_topology
from shared.config import load_settings
from shared.domain.messages import StepAction, StepOutcome, StepReply, StepRequest
from shared.domain.states import ErrorKind
from shared.domain.timing import utcnow
from shared.errors import (
    PublishRejected,
    PublishUnroutable,
    RemoteDeclined,
    RemoteFenced,
    RemoteRejected,
    StaleFencingToken,
)
from shared.remote.client import RemoteClient
from tests.conftest import RABBITMQ_URL, service_missing
from tests.support.remote_service import InProcessRemote, signature
from tests.support.waiting import eventually

Remote = InProcessRemote


@pytest.fixture
async def remote(tmp_path: Path) -> AsyncIterator[Remote]:
    r = Remote(tmp_path / "ledger.sqlite3")
    await r.start()
    yield r
    await r.stop()


@pytest.fixture
async def client(remote: Remote) -> AsyncIterator[RemoteClient]:
    c = remote.client()
    yield c
    await c.close()


def call(client: RemoteClient, operation: str, order_id: str, token: str, key: str | None = None):
    return client.call(
        operation,
        order_id=order_id,
        idempotency_key=key or f"{order_id}:{operation}",
        fencing_token=token,
        payload={"amount_cents": 100},
        timeout=5,
    )


async def test_a_repeated_key_returns_the_first_outcome_even_after_a_restart(
    remote: Remote, client
) -> None:
    first = await call(client, "payment.charge", "o-1", "o-1:1")
    again = await call(client, "payment.charge", "o-1", "o-1:1")
    assert (first["replayed"], again["replayed"]) == (False, True)
    assert again["seq"] == first["seq"]
    await remote.stop()
    await remote.start()
    after_restart = await call(client, "payment.charge", "o-1", "o-1:2")
    assert after_restart["seq"] == first["seq"] and after_restart["replayed"]
    assert len(await client.ledger(order_id="o-1")) == 1


async def test_accounts_never_share_keys_fences_or_undos(remote: Remote) -> None:
    # Two deployments (hubs) calling one remote service, with the same order id and key.
    a = remote.client(account="hub_a")
    b = remote.client(account="hub_b")
    try:
        first = await call(a, "payment.charge", "o-9", "o-9:3")
        other = await call(b, "payment.charge", "o-9", "o-9:1")  # A's attempt 3 fences not B
        assert not first["replayed"] and not other["replayed"]
        assert other["seq"] != first["seq"]
        undo = await call(b, "payment.refund", "o-9", "o-9:1")
        assert undo["outcome"] == "applied"  # B's refund undoes B's charge, not A's
        assert [e["operation"] for e in await a.ledger(order_id="o-9", account="hub_a")] == [
            "payment.charge"
        ]
        assert {e["account"] for e in await a.ledger(order_id="o-9")} == {"hub_a", "hub_b"}
        assert len(await a.ledger(account="hub_b")) == 2
    finally:
        await a.close()
        await b.close()


async def test_a_ledger_from_before_accounts_is_migrated_to_the_unnamed_account(
    tmp_path: Path,
) -> None:
    path = tmp_path / "old.sqlite3"
    db = sqlite3.connect(path)
    db.executescript(
        "CREATE TABLE effects (seq INTEGER PRIMARY KEY AUTOINCREMENT, idempotency_key TEXT NOT "
        "NULL UNIQUE, operation TEXT NOT NULL, order_id TEXT NOT NULL, fencing_token TEXT NOT "
        "NULL, outcome TEXT NOT NULL, result TEXT NOT NULL, at TEXT NOT NULL);"
        "CREATE TABLE fences (order_id TEXT PRIMARY KEY, attempt INTEGER NOT NULL);"
        "INSERT INTO effects VALUES (7, 'o-1:charge', 'payment.charge', 'o-1', 'o-1:2', "
        "'applied', '{}', '2026-01-01T00:00:00+00:00');"
        "INSERT INTO fences VALUES ('o-1', 2);"
    )
    db.close()
    ledger = Ledger(str(path))
    try:
        kept = ledger.find("", "o-1:charge")
        assert kept is not None and (kept.seq, kept.account) == (7, "")
        with pytest.raises(StaleFencingToken):
            ledger.observe_fence("", "o-1", "o-1:1")
        with pytest.raises(StaleFencingToken):  # the fence holds the token of its effect
            ledger.observe_fence("", "o-1", "o-1:2.another")
        ledger.observe_fence("", "o-1", "o-1:2")
        again = Ledger(str(path))  # a second open finds nothing left to migrate
        again.close()
    finally:
        ledger.close()


async def test_stale_fencing_tokens_are_refused(client) -> None:
    await call(client, "inventory.reserve", "o-2", "o-2:3")
    with pytest.raises(RemoteFenced):
        await call(client, "payment.charge", "o-2", "o-2:2")
    await call(client, "payment.charge", "o-2", "o-2:3")
    assert [e["operation"] for e in await client.ledger(order_id="o-2")] == [
        "inventory.reserve",
        "payment.charge",
    ]


async def test_declines_are_deterministic_and_undo_of_nothing_is_a_noop(
    remote: Remote, client
) -> None:
    await client.set_faults(decline_rate=1.0)
    with pytest.raises(RemoteDeclined):
        await call(client, "payment.charge", "o-3", "o-3:1")
    await client.set_faults(decline_rate=0.0)
    with pytest.raises(RemoteDeclined):
        await call(client, "payment.charge", "o-3", "o-3:1")  # the first outcome stands
    refund = await call(client, "payment.refund", "o-3", "o-3:2", key="o-3:charge:undo")
    assert refund["outcome"] == "noop"


async def test_fault_knobs_are_validated(client) -> None:
    with pytest.raises(RemoteRejected):
        await client.set_faults(transient_error_rate=2)
    with pytest.raises(RemoteRejected):
        await client.set_faults(nonsense=1)
    assert (await client.set_faults(latency_ms=5, outage=False))["latency_ms"] == 5


# -- the agent against the remote service and a real reply queue


class Refusing:
    """The real publisher, but the next `refusals` step replies fail with `error` first (by
    default the broker's refusal, a negative confirm, as from a quorum queue between leaders)
    before the rest are passed on."""

    def __init__(self, publisher: Publisher) -> None:
        self._publisher = publisher
        self.refusals = 0
        self.refused = 0
        self.error: Callable[[], Exception] = lambda: PublishRejected("refused (drill)")
        self.slow_s = 0.0
        """How long each refusal after the first takes (a confirm that does not come)."""

    async def publish(self, contract: Any, **kwargs: Any) -> None:
        if self.refusals > 0 and isinstance(contract, StepReply):
            self.refusals -= 1
            self.refused += 1
            if self.refused > 1:
                await asyncio.sleep(self.slow_s)
            raise self.error()
        await self._publisher.publish(contract, **kwargs)

    async def publish_raw(self, message: Any, *, exchange: str, routing_key: str) -> None:
        await self._publisher.publish_raw(message, exchange=exchange, routing_key=routing_key)

    async def close(self) -> None:
        await self._publisher.close()


class AgentRig:
    def __init__(self, remote: Remote, connection, settings) -> None:
        self.remote = remote
        self.replies: list[StepReply] = []
        self.connection = connection
        self.settings = settings
        self.publisher: Refusing

    async def start(self) -> None:
        self.queue = PrivateQueue(
            self.connection,
            Names(self.settings.hub).reply_queue("agent-test"),
            lambda c, m: self.replies.append(c),
            max_bytes=65536,
        )
        await self.queue.start()
        self.client = self.remote.agent_client()
        self.publisher = Refusing(await Publisher.open(self.connection, timeout=5))
        self.agent = Agent(
            "payment",
            self.client,
            self.publisher,
            self.settings.agents,
            hub=self.settings.hub,
            ticket_keep_s=self.settings.broker.inbox_ttl_s,
            tickets=MemoryTickets(),
        )

    async def ask(
        self, order_id: str, *, allowed: int = 3, seconds: float = 5, signed: bool = True
    ) -> None:
        request = StepRequest(
            order_id=order_id,
            step="charge",
            action=StepAction.DO,
            operation="payment.charge",
            fencing_token=f"{order_id}:1",
            fencing_signature=signature("", f"{order_id}:1") if signed else None,
            idempotency_key=f"{order_id}:charge",
            complete_by=utcnow() + timedelta(seconds=seconds),
            attempts_allowed=allowed,
            payload={"amount_cents": 500},
            reply_to=self.queue.name,
        )
        await self.agent.handle(
            Delivery(
                message=request,
                message_id=f"m-{order_id}",
                correlation_id=None,
                reply_to=None,
                headers={},
                deliveries=1,
            )
        )

    def calls(self) -> int:
        return self.remote.service.calls.total()


@pytest.fixture
async def rig(remote: Remote, hub: str) -> AsyncIterator[AgentRig]:
    try:
        connection = await connect(RABBITMQ_URL, timeout=5, name="agent-tests")
    except Exception as exc:
        service_missing("RabbitMQ", exc)
    settings = load_settings(breaker_fail_max=3, breaker_reset_s=60, hub=hub)
    names = Names(hub)
    # The agent replies through the hub's replies exchange, which the reply queue is bound to.
    policy = QueuePolicy(quorum=False, delivery_limit=5, orders_max_length=100)
    admin = await connection.admin()
    await declare_topology(admin, names, policy)
    r = AgentRig(remote, connection, settings)
    try:
        await r.start()
        yield r
    finally:
        await r.queue.stop()
        await r.client.close()
        await delete_topology(admin, names)
        await connection.close()


async def test_agent_replies_ok_with_the_attempts_it_used(rig: AgentRig) -> None:
    await rig.ask("o-ok")
    replies = await eventually(lambda: asyncio.sleep(0, rig.replies), what="a reply")
    assert replies[0].outcome is StepOutcome.OK and replies[0].attempts_used == 1


async def test_a_reply_the_broker_refuses_is_published_again_within_the_deadline(
    rig: AgentRig,
) -> None:
    """The effect is done: a reply refused while the broker fails over is sent again, not
    dropped (the request is acknowledged after, so a redelivery would be a duplicate)."""
    rig.publisher.refusals = 3
    await rig.ask("o-refused", seconds=10)
    [reply] = await eventually(lambda: asyncio.sleep(0, rig.replies), what="the reply")
    assert reply.order_id == "o-refused" and reply.outcome is StepOutcome.OK
    assert rig.publisher.refused == 3 and rig.calls() == 1, "the step's call is not made again"


async def test_a_reply_refused_until_the_deadline_is_given_up(
    rig: AgentRig, caplog: pytest.LogCaptureFixture
) -> None:
    """Past the deadline the scheduler waits no more; the supervisor recovers the step."""
    rig.publisher.refusals = 1000
    started = asyncio.get_running_loop().time()
    await rig.ask("o-refused-long", seconds=1.0)
    # The deadline, plus the remote call before it and one try's overrun at most.
    assert asyncio.get_running_loop().time() - started < 1.0 + 0.5, "it stopped at the deadline"
    assert rig.publisher.refused >= 2 and rig.replies == []
    assert "could not publish the reply by the step's deadline" in caplog.text


async def test_a_slow_try_again_is_cut_at_the_deadline(rig: AgentRig) -> None:
    """A try again that would outlast the deadline (no confirm coming) is cut there: the
    request is not held in hand for a publish timeout past it."""
    rig.publisher.refusals = 1000
    rig.publisher.slow_s = 5.0
    started = asyncio.get_running_loop().time()
    await rig.ask("o-refused-slowly", seconds=1.0)
    # Cut at the deadline, not after the 5 s publish: slack for a loaded machine.
    assert asyncio.get_running_loop().time() - started < 1.0 + 2.0
    assert rig.publisher.refused >= 2 and rig.replies == []


async def test_a_reply_nobody_waits_for_is_dropped_at_once(
    rig: AgentRig, caplog: pytest.LogCaptureFixture
) -> None:
    """Unroutable: the scheduler that asked is gone (its reply queue with it)."""
    caplog.set_level(logging.INFO, logger="services.agents.agent")
    rig.publisher.refusals = 1000
    rig.publisher.error = lambda: PublishUnroutable("no queue takes it (drill)")
    await rig.ask("o-unroutable", seconds=10)
    assert rig.publisher.refused == 1, "not tried again"
    assert "reply queue is gone" in caplog.text
    assert "could not publish the reply" not in caplog.text


async def test_a_reply_failing_for_another_reason_is_not_retried(rig: AgentRig) -> None:
    """Not an outage: the error reaches the consumer, whose outcome table decides (set aside,
    then dead-lettered), rather than being tried again until the deadline."""
    rig.publisher.refusals = 1000
    rig.publisher.error = lambda: ValueError("a bug (drill)")
    with pytest.raises(ValueError, match="a bug"):
        await rig.ask("o-bug", seconds=10)
    assert rig.publisher.refused == 1


async def test_agent_retries_transient_failures_within_its_allowance_then_says_so(
    rig: AgentRig,
) -> None:
    rig.remote.service.faults.transient_error_rate = 1.0
    await rig.ask("o-transient", allowed=2)
    assert rig.calls() == 2
    [reply] = await eventually(lambda: asyncio.sleep(0, rig.replies), what="a reply")
    assert (reply.outcome, reply.error_kind) == (StepOutcome.ERROR, ErrorKind.TRANSIENT)
    assert reply.attempts_used == 2 and "503" in (reply.error_message or "")


async def test_an_unsigned_request_is_refused_and_given_back_at_once(rig: AgentRig) -> None:
    """A request from a scheduler without a fence key, or from one before signatures (the field
    is optional, so it still decodes): the remote refuses its token (403: no effect, no attempt
    counted), the agent does not try again, and answers transient, so the attempt gives the
    order back at once for one that signs."""
    await rig.ask("o-unsigned", allowed=3, signed=False)
    [reply] = await eventually(lambda: asyncio.sleep(0, rig.replies), what="a reply")
    assert (reply.outcome, reply.error_kind) == (StepOutcome.ERROR, ErrorKind.TRANSIENT)
    assert reply.attempts_used == 1 and "HTTP 403" in (reply.error_message or "")
    assert "not signed" in (reply.error_message or "")
    assert rig.remote.service.ledger.effects_of(None, "o-unsigned") == []
    assert rig.remote.service.ledger.attempts_of(None, "o-unsigned") == []


async def test_agent_reports_a_decline_as_a_non_transient_error(rig: AgentRig) -> None:
    rig.remote.service.faults.decline_rate = 1.0
    await rig.ask("o-declined")
    replies = await eventually(lambda: asyncio.sleep(0, rig.replies), what="a reply")
    assert replies[0].outcome is StepOutcome.ERROR
    assert "declined" in replies[0].error_message
    assert rig.calls() == 1, "a permanent failure is not retried"


async def test_agent_makes_no_call_after_the_deadline(rig: AgentRig) -> None:
    await rig.ask("o-late", seconds=-1)
    assert rig.calls() == 0 and rig.replies == []


async def test_a_call_cut_off_by_the_deadline_gets_no_reply(rig: AgentRig) -> None:
    """The scheduler stopped waiting at the deadline; a transient reply then would only race
    its timer (and decide whether the scheduler or the supervisor recovers the step)."""
    rig.remote.service.faults.hang_rate = 1.0
    rig.remote.service.faults.hang_s = 1.0
    await rig.ask("o-hung", seconds=0.5)

    async def counted() -> bool:  # the remote counts a call once it is done with it
        return rig.calls() == 1

    await eventually(counted, what="the hung call, cut off by the agent at the deadline")
    rig.remote.service.faults.hang_rate = 0.0
    await rig.ask("o-after")  # answered: had the first been answered, its reply came first
    [reply] = await eventually(lambda: asyncio.sleep(0, rig.replies), what="a reply")
    assert reply.order_id == "o-after"


async def test_circuit_opens_after_consecutive_failures_and_fails_fast(rig: AgentRig) -> None:
    rig.remote.service.faults.outage = True
    await rig.ask("o-a", allowed=2)  # 2 failures
    await rig.ask("o-b", allowed=2)  # the 3rd failure opens the circuit
    assert rig.calls() == 3
    assert rig.agent.open_circuits() == ["payment.charge"]
    await rig.ask("o-c", allowed=3)
    assert rig.calls() == 3, "an open circuit makes no call"

    async def two() -> list[StepReply] | None:
        return rig.replies if len(rig.replies) == 2 else None

    replies = await eventually(two, what="replies to the requests that made calls")
    assert {r.order_id for r in replies} == {"o-a", "o-b"}
    assert all(r.error_kind is ErrorKind.TRANSIENT for r in replies)
    # The request the open circuit failed fast made no call and gets no reply: its deadline
    # paces the retries while the remote service is down.
    assert "o-c" not in {r.order_id for r in rig.replies}
