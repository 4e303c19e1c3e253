"""The fault drills (shared/broker/drills.py): a share of messages published twice, a share of
step replies held back and nothing else, and the bootstrap wraps a publisher in them only when a
drill's setting is non-zero."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

import aio_pika

from harness.simulation import loop as virtual
from shared.bootstrap import fault_drills, open_publisher
from shared.broker.drills import DrillPublisher, Drills, drilled
from shared.broker.memory import MemoryBroker, connect
from shared.broker.publisher import Publisher
from shared.config import load_settings
from shared.domain.messages import (
    Contract,
    OrderStatus,
    OrderStatusUpdate,
    StepAction,
    StepOutcome,
    StepReply,
    StepRequest,
)
from shared.domain.states import ProcessState

MESSAGES = 1000


class Recorder:
    """A publisher that records what it is asked to publish, and when (the loop's time)."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, float]] = []
        self.raw: list[aio_pika.Message] = []
        self.closed = False

    async def publish(self, contract: Contract, *, message_id: str, **where: Any) -> None:
        self.sent.append((message_id, asyncio.get_running_loop().time()))

    async def publish_raw(self, message: aio_pika.Message, **where: str) -> None:
        self.raw.append(message)

    async def close(self) -> None:
        self.closed = True


def reply(i: int) -> StepReply:
    return StepReply(
        order_id=f"o-{i}",
        step="charge",
        action=StepAction.DO,
        fencing_token=f"o-{i}:1",
        idempotency_key=f"o-{i}:charge",
        outcome=StepOutcome.OK,
        attempts_used=1,
        result={},
    )


def request(i: int) -> StepRequest:
    return StepRequest(
        order_id=f"o-{i}",
        step="charge",
        action=StepAction.DO,
        operation="payment.charge",
        fencing_token=f"o-{i}:1",
        idempotency_key=f"o-{i}:charge",
        complete_by=datetime(2030, 1, 1, tzinfo=UTC),
        attempts_allowed=3,
        reply_to="t.reply.x",
    )


def status(i: int) -> OrderStatusUpdate:
    return OrderStatusUpdate(
        order_id=f"o-{i}",
        status=OrderStatus.PROCESSING,
        process_state=ProcessState.PROCESSING,
        at=datetime(2030, 1, 1, tzinfo=UTC),
    )


async def publish(publisher: DrillPublisher, contract: Contract, message_id: str) -> float:
    """Seconds (virtual) the publish took."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    await publisher.publish(contract, exchange="x", routing_key="k", message_id=message_id)
    return loop.time() - started


def test_a_share_of_messages_is_published_twice_with_the_same_message_id() -> None:
    async def main() -> list[str]:
        inner = Recorder()
        drill = DrillPublisher(inner, Drills(duplicate_rate=0.3, seed=5))
        for i in range(MESSAGES):
            contract = (status, request, reply)[i % 3](i)
            assert await publish(drill, contract, f"m-{i}") == 0
        return [message_id for message_id, _ in inner.sent]

    sent = virtual.run(main())
    twice = [m for m in {*sent} if sent.count(m) == 2]
    assert {sent.count(m) for m in sent} == {1, 2}
    assert 0.25 < len(twice) / MESSAGES < 0.35
    for message_id in twice:
        assert sent[sent.index(message_id) + 1] == message_id, "the copy right after it"
    assert sorted({*sent}) == sorted(f"m-{i}" for i in range(MESSAGES))


def test_a_share_of_step_replies_is_held_back_and_nothing_else() -> None:
    async def main() -> tuple[list[float], list[float], Recorder]:
        inner = Recorder()
        drill = DrillPublisher(inner, Drills(reply_delay_rate=0.5, reply_delay_s=3.0, seed=6))
        replies, others = [], []
        for i in range(MESSAGES):
            replies.append(await publish(drill, reply(i), f"r-{i}"))
            others.append(await publish(drill, request(i), f"q-{i}"))
            others.append(await publish(drill, status(i), f"s-{i}"))
        raw = aio_pika.Message(b"{}", message_id="dead-letter")
        await drill.publish_raw(raw, exchange="x", routing_key="k")
        await drill.close()
        return replies, others, inner

    replies, others, inner = virtual.run(main())
    assert set(replies) == {0.0, 3.0}
    assert 0.45 < replies.count(3.0) / MESSAGES < 0.55
    assert set(others) == {0.0}, "only step replies are held back"
    assert len(inner.sent) == 3 * MESSAGES, "none duplicated"
    assert [m.message_id for m in inner.raw] == ["dead-letter"] and inner.closed


def test_the_same_seed_makes_the_same_choices_whichever_drills_are_on() -> None:
    async def duplicated(drills: Drills) -> list[str]:
        inner = Recorder()
        drill = DrillPublisher(inner, drills)
        for i in range(200):
            await publish(drill, reply(i), f"r-{i}")
        return [m for m, _ in inner.sent]

    alone = virtual.run(duplicated(Drills(duplicate_rate=0.5, seed=9)))
    both = virtual.run(
        duplicated(Drills(duplicate_rate=0.5, reply_delay_rate=0.5, reply_delay_s=1, seed=9))
    )
    assert alone == both


def test_the_bootstrap_wraps_a_publisher_only_when_a_drill_is_on() -> None:
    assert not fault_drills(load_settings().drills).on
    assert fault_drills(load_settings(fault_duplicate_rate=0.1).drills).on
    assert fault_drills(load_settings(fault_reply_delay_rate=0.1, fault_reply_delay_ms=5).drills).on
    assert fault_drills(load_settings(fault_reply_delay_ms=5).drills) == Drills(reply_delay_s=0.005)
    inner = Recorder()
    assert drilled(inner, Drills(seed=3)) is inner

    async def opened(**settings: Any) -> object:
        connection = connect(MemoryBroker(), "guest")
        return await open_publisher(load_settings(**settings), connection)

    assert type(asyncio.run(opened())) is Publisher
    assert type(asyncio.run(opened(fault_duplicate_rate=0.5))) is DrillPublisher
    assert type(asyncio.run(opened(fault_reply_delay_rate=0.5))) is DrillPublisher
