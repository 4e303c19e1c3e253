"""The acks a consumer sends together (shared/broker/acks.py): whatever is in hand, settled by
another path, abandoned unsettled, or on a channel that has closed since, no `multiple` ack passes
over a delivery that is not settled, and every ack asked for is answered."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any, cast

from aiormq.exceptions import ChannelInvalidStateError
from hypothesis import example, given, settings
from hypothesis import strategies as st

from shared.broker.acks import Acks


class _Channel:
    """A channel as the broker keeps it: the tags delivered on it and not yet settled. An ack
    of a tag not unsettled is a channel error (PRECONDITION_FAILED, unknown delivery tag); a
    multiple ack settles every unsettled tag up to its own. `asked` is what the consumer wants
    acked: an ack that settles anything else has lost a message."""

    def __init__(self) -> None:
        self.is_closed = False
        self.delivered = 0
        self.unsettled: set[int] = set()
        self.asked: set[int] = set()
        self.acked: set[int] = set()
        self.frames: list[tuple[int, bool]] = []
        """The acks written on it: (tag, multiple)."""
        self.violations: list[str] = []

    def deliver(self) -> _Delivery:
        self.delivered += 1
        self.unsettled.add(self.delivered)
        return _Delivery(self, self.delivered)


@dataclass(eq=False)
class _Delivery:
    """What `Acks` uses of an aio-pika delivery: its channel raises once closed, as aio-pika's."""

    wire: _Channel
    delivery_tag: int
    processed: bool = False

    @property
    def channel(self) -> _Channel:
        if self.wire.is_closed:
            raise ChannelInvalidStateError
        return self.wire

    def settled_elsewhere(self) -> None:
        """Rejected or returned by another path."""
        if not self.wire.is_closed:
            self.wire.unsettled.discard(self.delivery_tag)
            self.processed = True

    async def ack(self, multiple: bool = False) -> None:
        await asyncio.sleep(0)  # the frame goes through the connection's write queue
        wire = self.wire
        if wire.is_closed:
            raise ChannelInvalidStateError("closed")
        tag = self.delivery_tag
        wire.frames.append((tag, multiple))
        if tag not in wire.unsettled:
            wire.violations.append(f"ack of tag {tag}, not unsettled: the channel closes")
        settles = {t for t in wire.unsettled if t <= tag} if multiple else {tag}
        if lost := settles - wire.asked:
            wire.violations.append(f"ack {tag} multiple settles {sorted(lost)}, not asked for")
        wire.unsettled -= settles
        wire.acked |= settles
        self.processed = True


def _asking(acks: Acks, delivery: _Delivery) -> Coroutine[Any, Any, None]:
    """The handling's ack, once it counts as asked for."""
    delivery.wire.asked.add(delivery.delivery_tag)
    return acks.ack(cast(Any, delivery))


STATES = ("in-hand", "settled-elsewhere", "abandoned", "acking")


@st.composite
def hands(draw: st.DrawFn) -> tuple[list[_Channel], list[tuple[_Delivery, str]], bool]:
    """Two incarnations of a channel and deliveries on them, each in one of `STATES` (at least
    one being acked), and whether the first incarnation closes before the acks are asked for."""
    old, now = _Channel(), _Channel()
    count = draw(st.integers(1, 16))
    deliveries = []
    for _ in range(count):
        wire = draw(st.sampled_from([old, now]))
        deliveries.append((wire.deliver(), draw(st.sampled_from(STATES))))
    if not any(state == "acking" for _, state in deliveries):
        deliveries[-1] = (deliveries[-1][0], "acking")
    return [old, now], deliveries, draw(st.booleans())


@settings(max_examples=300, deadline=None)
@given(hands())
def test_no_multiple_ack_passes_over_a_delivery_not_settled(
    drawn: tuple[list[_Channel], list[tuple[_Delivery, str]], bool],
) -> None:
    channels, deliveries, close_old = drawn
    acking = [d for d, state in deliveries if state == "acking"]

    async def scenario() -> list[object]:
        acks = Acks()
        for delivery, _ in deliveries:
            acks.taken(cast(Any, delivery))
        for delivery, state in deliveries:
            if state == "settled-elsewhere":
                delivery.settled_elsewhere()
                acks.left(cast(Any, delivery))
            elif state == "abandoned":
                acks.left(cast(Any, delivery))  # a cancelled handling: left unsettled
        channels[0].is_closed = close_old
        asked = [_asking(acks, d) for d in acking]
        return await asyncio.wait_for(asyncio.gather(*asked, return_exceptions=True), 5.0)

    results = asyncio.run(scenario())
    for delivery, result in zip(acking, results, strict=True):
        if delivery.wire.is_closed:
            assert isinstance(result, ChannelInvalidStateError)
        else:
            assert result is None, result
    for channel in channels:
        assert not channel.violations, channel.violations


def test_a_delivery_taken_on_a_closed_channel_is_acked_alone_and_fails() -> None:
    async def scenario() -> BaseException | None:
        channel = _Channel()
        delivery = channel.deliver()
        channel.is_closed = True
        acks = Acks()
        acks.taken(cast(Any, delivery))  # its channel cannot be read
        try:
            await asyncio.wait_for(_asking(acks, delivery), 5.0)
        except ChannelInvalidStateError as exc:
            return exc
        return None

    assert asyncio.run(scenario()) is not None


def test_acks_asked_for_together_go_as_one_multiple_ack() -> None:
    async def scenario() -> _Channel:
        channel = _Channel()
        deliveries = [channel.deliver() for _ in range(5)]
        acks = Acks()
        for delivery in deliveries:
            acks.taken(cast(Any, delivery))
        await asyncio.gather(*(_asking(acks, d) for d in deliveries))
        for delivery in deliveries:
            acks.left(cast(Any, delivery))
        assert acks.unsettled == 0
        return channel

    channel = asyncio.run(scenario())
    assert channel.frames == [(5, True)] and not channel.violations


def test_a_delivery_left_unsettled_keeps_the_acks_above_it_single() -> None:
    """A handling cancelled by a drain leaves its delivery unsettled: a multiple ack above it
    would ack it (and lose it). The acks above it go one by one, until its channel closes."""

    async def scenario() -> _Channel:
        channel = _Channel()
        cancelled, *rest = [channel.deliver() for _ in range(3)]
        acks = Acks()
        for delivery in (cancelled, *rest):
            acks.taken(cast(Any, delivery))
        acks.left(cast(Any, cancelled))
        await asyncio.gather(*(_asking(acks, d) for d in rest))
        channel.is_closed = True
        acks.left(cast(Any, rest[0]))
        assert acks.unsettled == 0, "its channel closed: the book forgets its deliveries"
        return channel

    channel = asyncio.run(scenario())
    assert channel.frames == [(2, False), (3, False)] and not channel.violations


# --- Schedules: the book changing between batches --------------------------------------------


OPS = st.lists(
    st.tuples(
        # Deliveries and acks drawn more often: a multiple ack needs several of each.
        st.sampled_from(
            ["deliver"] * 3
            + ["ack"] * 3
            + ["reject", "abandon", "stop-waiting", "turn", "turn", "reconnect"]
        ),
        st.integers(0, 30),
    ),
    max_size=60,
)


class _Schedule:
    """A consumer's side of one drawn schedule: what it has in hand, and what it asked to ack."""

    def __init__(self) -> None:
        self.acks = Acks()
        self.wires = [_Channel()]
        self.in_hand: list[_Delivery] = []
        self.asking: list[tuple[_Delivery, asyncio.Task[None]]] = []

    def _pick(self, i: int) -> _Delivery | None:
        return self.in_hand.pop(i % len(self.in_hand)) if self.in_hand else None

    async def _handle_then_ack(self, message: _Delivery) -> None:
        try:
            await _asking(self.acks, message)
        finally:
            self.acks.left(cast(Any, message))

    async def deliver(self, _: int) -> None:
        message = self.wires[-1].deliver()
        self.acks.taken(cast(Any, message))
        self.in_hand.append(message)

    async def ack(self, i: int) -> None:
        if message := self._pick(i):
            self.asking.append((message, asyncio.create_task(self._handle_then_ack(message))))

    async def reject(self, i: int) -> None:
        if message := self._pick(i):
            message.settled_elsewhere()
            self.acks.left(cast(Any, message))

    async def abandon(self, i: int) -> None:
        if message := self._pick(i):
            self.acks.left(cast(Any, message))  # a cancelled handling: left unsettled

    async def stop_waiting(self, i: int) -> None:
        if self.asking:
            self.asking[i % len(self.asking)][1].cancel()

    async def turn(self, _: int) -> None:
        await asyncio.sleep(0)

    async def reconnect(self, _: int) -> None:
        self.wires[-1].is_closed = True
        self.wires[-1].unsettled.clear()  # back to the queue, with the channel
        self.wires.append(_Channel())

    async def run(self, ops: list[tuple[str, int]]) -> None:
        for op, i in ops:
            await getattr(self, op.replace("-", "_"))(i)
        tasks = [task for _, task in self.asking]
        await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 5.0)
        for message, task in self.asking:
            if not task.cancelled() and task.exception() is None:
                assert message.delivery_tag in message.wire.acked, "answered, not acked"


@settings(max_examples=1000, deadline=None)
@given(OPS)
@example([("deliver", 0)] * 3 + [("abandon", 0), ("ack", 0), ("ack", 0)])  # a mutation's
def test_any_schedule_of_deliveries_acks_and_reconnections_loses_nothing(
    ops: list[tuple[str, int]],
) -> None:
    """Deliveries arrive, are acked (each handling asks, then leaves), rejected by another path,
    abandoned unsettled, or their handling stops waiting for its ack; turns of the loop pass
    between; the channel is replaced. No ack settles a delivery not asked for, none acks a tag
    twice, every ack asked for is answered, and each answered without error settled its tag."""
    schedule = _Schedule()
    asyncio.run(schedule.run(ops))
    for wire in schedule.wires:
        assert not wire.violations, wire.violations
