"""The publisher takes a new channel after the broker refused a publish (RabbitMQ 3.10 can refuse
every publish of one channel to a quorum queue whose leader died: tests/system/
test_rabbitmq_cluster.py shows it on a real cluster). Here, on fake channels: what is renewed,
how often, and that no channel is closed under a publish still waiting for its confirm."""

from __future__ import annotations

import asyncio
from typing import Any

import aio_pika
import aiormq.exceptions
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pamqp.commands import Basic

from shared.broker.port import Outgoing
from shared.broker.rabbitmq import sender as publishing
from shared.broker.rabbitmq.sender import RabbitSender
from shared.errors import PublishRejected


class FakeChannel:
    """A confirming channel that takes or refuses each publish as its `outcomes` say (the last
    repeated): a refusal at once, a confirm once `gate` is set (when there is one)."""

    def __init__(self, number: int, outcomes: list[bool]) -> None:
        self.number = number
        self.outcomes = outcomes
        self.gate: asyncio.Event | None = None
        self.held = asyncio.Event()
        """Set once a publish waits at the gate."""
        self.waiting = 0
        self.taken = 0
        self.closed = False
        self.closed_under_waiting = False
        self.default_exchange = FakeExchange(self)

    async def get_exchange(self, name: str, *, ensure: bool = False) -> FakeExchange:
        return self.default_exchange

    async def close(self) -> None:
        self.closed_under_waiting |= self.waiting > 0
        self.closed = True


class FakeExchange:
    def __init__(self, channel: FakeChannel) -> None:
        self.channel = channel

    async def publish(self, message: aio_pika.Message, routing_key: str, **_: Any) -> None:
        channel = self.channel
        assert not channel.closed, "published on a closed channel"
        take = channel.outcomes.pop(0) if len(channel.outcomes) > 1 else channel.outcomes[0]
        if not take:
            raise aiormq.exceptions.DeliveryError(None, Basic.Nack(0))
        channel.waiting += 1
        try:
            if channel.gate is not None:
                channel.held.set()
                await channel.gate.wait()
            channel.taken += 1
        finally:
            channel.waiting -= 1


class Channels:
    """What the sender reopens from: channel n takes or refuses as `plans[n]` says."""

    def __init__(self, *plans: list[bool], fail_opening: int = 0) -> None:
        self.plans = list(plans)
        self.opened: list[FakeChannel] = []
        self.fail_opening = fail_opening

    async def open(self) -> Any:
        if self.fail_opening:
            self.fail_opening -= 1
            raise aiormq.exceptions.ChannelInvalidStateError("No active transport in channel")
        plan = self.plans[min(len(self.opened), len(self.plans) - 1)]
        self.opened.append(FakeChannel(len(self.opened), list(plan)))
        return self.opened[-1]

    async def publisher(self) -> RabbitSender:
        return RabbitSender(await self.open(), timeout=5, reopen=self.open)


async def send(publisher: RabbitSender) -> bool:
    try:
        await publisher.publish(Outgoing(b"{}"), exchange="", routing_key="q")
    except PublishRejected:
        return False
    return True


@pytest.fixture
def renew_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(publishing, "RENEW_AFTER_S", 0.0)


async def test_a_refused_publish_sends_the_next_on_a_new_channel(renew_at_once: None) -> None:
    channels = Channels([False], [True])  # the first channel refuses every publish
    publisher = await channels.publisher()
    assert [await send(publisher) for _ in range(3)] == [False, True, True]
    first, second = channels.opened
    assert first.closed and not second.closed
    assert second.taken == 2


async def test_a_channel_that_takes_its_publishes_is_kept() -> None:
    channels = Channels([True])
    publisher = await channels.publisher()
    assert all([await send(publisher) for _ in range(5)])
    assert len(channels.opened) == 1


async def test_a_new_channel_is_not_renewed_again_within_the_interval() -> None:
    # The initial channel is renewed at its first refusal; the new one, refusing too (a full
    # backlog refuses every channel), is kept for RENEW_AFTER_S (1 s, more than this test).
    channels = Channels([False])
    publisher = await channels.publisher()
    assert not any([await send(publisher) for _ in range(10)])
    assert len(channels.opened) == 2


async def test_renewals_go_on_while_each_new_channel_is_refused(renew_at_once: None) -> None:
    # A channel opened while the queue's record still names the dead leader is refused too;
    # the next one, opened after the new leader is recorded, is served.
    channels = Channels([False], [False], [False], [True])
    publisher = await channels.publisher()
    assert [await send(publisher) for _ in range(5)] == [False, False, False, True, True]
    assert [c.closed for c in channels.opened] == [True, True, True, False]


async def test_a_channel_that_cannot_be_opened_leaves_the_old_one_in_use() -> None:
    # Tried again only after RENEW_AFTER_S (1 s, more than this test).
    channels = Channels([False, True, True], [True])
    publisher = await channels.publisher()
    channels.fail_opening = 1  # the connection being restored
    assert [await send(publisher) for _ in range(3)] == [False, True, True]
    assert len(channels.opened) == 1 and not channels.opened[0].closed


async def test_a_publisher_without_reopen_keeps_its_channel() -> None:
    channel = FakeChannel(0, [False])
    publisher = RabbitSender(channel, timeout=5)  # type: ignore[arg-type]
    assert not any([await send(publisher) for _ in range(3)])
    assert not channel.closed


async def test_the_old_channel_is_closed_only_once_its_waiting_publish_is_done(
    renew_at_once: None,
) -> None:
    channels = Channels([True, False], [True])
    publisher = await channels.publisher()
    first = channels.opened[0]
    first.gate = asyncio.Event()
    waiting = asyncio.create_task(send(publisher))  # taken, once the gate opens
    await first.held.wait()
    assert not await send(publisher)  # refused on the first channel
    assert await send(publisher)  # renewed: taken on the second
    assert not first.closed  # a publish still waits on it
    first.gate.set()
    assert await waiting
    assert first.closed and not first.closed_under_waiting


@settings(max_examples=200, deadline=None)
@given(
    plans=st.lists(st.lists(st.booleans(), min_size=1, max_size=4), min_size=1, max_size=5),
    rounds=st.lists(st.integers(min_value=1, max_value=4), min_size=1, max_size=8),
)
def test_no_channel_is_closed_under_a_waiting_publish(
    plans: list[list[bool]], rounds: list[int]
) -> None:
    """Any plan of refusals, publishes sent several at a time: no channel is closed while a
    publish waits on it for its confirm, every channel but the one in use is closed in the end,
    and a channel is opened only after a refusal."""
    publishing_renew = publishing.RENEW_AFTER_S
    publishing.RENEW_AFTER_S = 0.0
    try:
        asyncio.run(_rounds(plans, rounds))
    finally:
        publishing.RENEW_AFTER_S = publishing_renew


async def _rounds(plans: list[list[bool]], rounds: list[int]) -> None:
    channels = Channels(*plans)
    publisher = await channels.publisher()
    refused = 0
    for count in rounds:
        gate = asyncio.Event()
        for channel in channels.opened:
            channel.gate = gate
        sent = [asyncio.create_task(send(publisher)) for _ in range(count)]
        await asyncio.sleep(0)
        gate.set()
        refused += sum(not taken for taken in await asyncio.gather(*sent))
    opened = channels.opened
    assert not any(c.closed_under_waiting for c in opened)
    assert [c.closed for c in opened] == [True] * (len(opened) - 1) + [False]
    assert len(opened) <= 1 + refused
