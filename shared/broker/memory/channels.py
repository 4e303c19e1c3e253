"""The channels of a memory connection (adapter.py): what every channel shares, and the feed
with the deliveries it hands out (port.Feed, port.Incoming), over the broker model (server.py).

A channel is robust, as RabbitMQ's adapter's is: a refused operation leaves it open, and an
outage closes only its incarnation on the wire (`Wire`): the deliveries it held go back to their
queues, counted, and settling one of them fails (`BrokerRefused`: no outage to wait out, as
aio-pika's error on a channel that was replaced is none), and its consumers stay subscribed
and get deliveries again when the broker returns.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from shared.broker.memory.objects import (
    NOT_FOUND,
    PRECONDITION_FAILED,
    RESOURCE_LOCKED,
    Consumer,
    Properties,
    Queue,
    Refused,
    Stored,
)
from shared.broker.port import (
    BrokerRefused,
    BrokerUnavailable,
    QueueMismatch,
    QueueMissing,
    Take,
)

if TYPE_CHECKING:
    from shared.broker.memory.adapter import MemoryConnection

log = logging.getLogger(__name__)

UNLIMITED = 2**31
"""The prefetch of a feed opened with none (0): no limit, as AMQP's 0 means."""


@contextmanager
def refusals() -> Iterator[None]:
    """The broker model's refusals as the port's errors."""
    try:
        yield
    except Refused as refused:
        raise _refusal(refused) from None


def _refusal(refused: Refused) -> BrokerRefused:
    if refused.code == NOT_FOUND:
        return QueueMissing(refused.text)
    if refused.code in (PRECONDITION_FAILED, RESOURCE_LOCKED):
        return QueueMismatch(refused.text)
    return BrokerRefused(refused.text)


class Channel:
    """One channel of a memory connection: what senders, feeds and admins share."""

    def __init__(self, connection: MemoryConnection) -> None:
        self.connection = connection
        """Also the owner of the exclusive queues it declares (the broker model asks it)."""
        self.broker = connection.broker
        self.is_closed = False

    def check(self) -> None:
        """Raise `BrokerUnavailable` unless the channel and its connection are up."""
        if self.is_closed:
            raise BrokerUnavailable("the channel is closed")
        self.connection.check()

    async def round_trip(self) -> None:
        """As a request to the broker and its answer: other tasks run in between, and the
        connection may go meanwhile."""
        self.check()
        await asyncio.sleep(0)
        self.check()

    def relink(self, up: bool) -> None:
        """The connection went down or came back (an outage): nothing to do for a channel
        that holds nothing."""

    def drop(self) -> None:
        """Closed at once (by its owner, or with its connection)."""
        if self.is_closed:
            return
        self.is_closed = True
        self.relink(False)
        self.connection.forget(self)

    async def close(self) -> None:
        self.drop()


class Wire:
    """One incarnation of a feed's channel on the wire: what its deliveries settle through.
    The feed gets a new one when the broker comes back; settling on the old one fails."""

    def __init__(self) -> None:
        self.is_closed = False


@dataclass
class _Held:
    """A delivery in the feed's hands, unsettled, as the broker model handed it over."""

    queue: Queue
    consumer: Consumer
    message: Stored
    delivery: MemoryDelivery | None = None
    """Made when it reaches the consumer (a task of its own, after the broker handed it)."""


async def _nothing(message: Stored, tag: int) -> None:
    """The callback of the holder of a delivery taken with `get`: never called."""


class MemoryFeed(Channel):
    """A channel that consumes (port.Feed): at most `prefetch` unsettled per consumer."""

    def __init__(self, connection: MemoryConnection, prefetch: int) -> None:
        super().__init__(connection)
        self.prefetch = prefetch or UNLIMITED
        self.consumers: dict[str, Consumer] = {}
        """Its consumers by tag (the broker model removes one whose queue it deletes)."""
        self._wire = Wire()
        self._held: dict[int, _Held] = {}
        self._unrestored: set[str] = set()
        """Tags of the consumers an outage ends (`restore=False`)."""

    async def own_queue(self, name: str, *, bind_to: str | None, routing_key: str = "") -> None:
        await self.round_trip()
        with refusals():
            self.broker.declare_queue(
                name,
                owner=self.connection,
                durable=False,
                auto_delete=True,
                exclusive=True,
                arguments={},
            )
            if bind_to is not None:
                self.broker.bind(name, bind_to, routing_key, self.connection)

    async def consume(
        self, queue: str, take: Take, *, ack: bool = True, restore: bool = True
    ) -> str:
        await self.round_trip()
        tag = f"ctag-{self.broker.next_tag()}"

        async def deliver(message: Stored, delivery_tag: int) -> None:
            await self._hand(take, message, delivery_tag, no_ack=not ack)

        context = contextvars.copy_context()
        consumer = Consumer(tag, queue, self, deliver, self.prefetch, not ack, context)
        with refusals():
            self.broker.subscribe(consumer)
        self.consumers[tag] = consumer
        if not restore:
            self._unrestored.add(tag)
        return tag

    async def _hand(self, take: Take, message: Stored, tag: int, *, no_ack: bool) -> None:
        """One delivery to the consumer's `take`, unless the channel gave it back before it
        got there (an outage, a close): the broker delivers it again."""
        held = self._held.get(tag)
        if not no_ack and held is None:
            return
        delivery = MemoryDelivery(self, tag, message, self._wire, no_ack=no_ack)
        if held is not None:
            held.delivery = delivery
        try:
            await take(delivery)
        except Exception:
            log.exception("a consumer failed on a delivery", extra={"delivery_tag": tag})

    async def cancel(self, tag: str) -> None:
        """Stop the consumer: what it holds stays held, to be settled."""
        await self.round_trip()
        consumer = self.consumers.pop(tag, None)
        if consumer is not None:
            self.broker.unsubscribe(consumer)

    async def consuming(self, tag: str) -> bool:
        """False while an outage has the channel down too: its consumers come back with it."""
        return not self._wire.is_closed and tag in self.consumers

    async def get(self, queue: str) -> MemoryDelivery | None:
        await self.round_trip()
        with refusals():
            taken = self.broker.take(queue, self.connection)
        if taken is None:
            return None
        found, message = taken
        tag = self.broker.next_tag()
        context = contextvars.copy_context()
        holder = Consumer("", queue, self, _nothing, 1, False, context)
        self.hold(tag, found, holder, message)
        delivery = MemoryDelivery(self, tag, message, self._wire, no_ack=False)
        self._held[tag].delivery = delivery
        return delivery

    def hold(self, tag: int, queue: Queue, consumer: Consumer, message: Stored) -> None:
        """The broker handed the delivery `tag` to this channel, unsettled (server.py)."""
        self._held[tag] = _Held(queue, consumer, message)

    def settle(self, tag: int, wire: Wire, how: str, *, multiple: bool) -> None:
        """Settle a delivery (`how`: as `MemoryBroker.settle`), or, `multiple`, every one the
        channel holds up to it, as AMQP has it."""
        if wire.is_closed:
            raise BrokerRefused(f"the channel of delivery {tag} is gone: it went back")
        if tag not in self._held:
            raise BrokerRefused(f"unknown delivery tag {tag}")
        for settled in _in_turn([t for t in self._held if t <= tag] if multiple else [tag], how):
            held = self._held.pop(settled)
            if held.delivery is not None:
                held.delivery.settled = True
            self.broker.settle(held.queue, held.consumer, held.message, settled, how)

    def relink(self, up: bool) -> None:
        if up:
            if self._wire.is_closed and not self.is_closed:
                self._wire = Wire()
            return
        self._wire.is_closed = True
        for gone in self._unrestored & set(self.consumers):  # not restored: gone with the wire
            self.broker.unsubscribe(self.consumers.pop(gone))
        self._unrestored.clear()
        held, self._held = self._held, {}
        for tag, each in sorted(held.items(), reverse=True):  # back in the order they came
            each.consumer.in_hand.discard(tag)
            self.broker.give_back(each.queue, each.message)
        for queue in {each.queue.name: each.queue for each in held.values()}.values():
            self.broker.wake(queue)

    def drop(self) -> None:
        """Closed: its consumers go, and every delivery it held goes back, counted."""
        if self.is_closed:
            return
        for consumer in list(self.consumers.values()):
            self.broker.unsubscribe(consumer)
        self.consumers.clear()
        super().drop()


def _in_turn(tags: list[int], how: str) -> list[int]:
    """The order to settle deliveries in: those that go back to their queue (each to its
    head) last first, so that they wait there in the order they came, as on RabbitMQ."""
    return sorted(tags, reverse=how in ("requeue", "return"))


class MemoryDelivery:
    """One delivery (port.Incoming): its properties decoded as a client reads them off the
    wire, and its settling through the channel incarnation it came on."""

    def __init__(
        self, feed: MemoryFeed, tag: int, message: Stored, wire: Wire, *, no_ack: bool
    ) -> None:
        props = feed.broker.delivered(message)
        self._feed = feed
        self._wire = wire
        self.settled = no_ack
        """Acked, nacked or rejected, by whichever path (an `ack=False` delivery: at once)."""
        self.body = message.body
        self.exchange: str | None = message.exchange
        self.routing_key: str | None = message.routing_key
        self.redelivered: bool | None = message.redelivered
        self.delivery_tag: int | None = tag
        self._read(props)

    def _read(self, props: Properties) -> None:
        self.headers: Mapping[str, Any] = dict(props.headers or {})
        self.message_id = _text(props.message_id)
        self.correlation_id = _text(props.correlation_id)
        self.reply_to = _text(props.reply_to)
        self.type = _text(props.message_type)
        self.content_type = _text(props.content_type)
        self.user_id = _text(props.user_id)
        self.app_id = _text(props.app_id)
        self.expiration = _seconds(props.expiration)
        self.timestamp: datetime | None = props.timestamp

    @property
    def processed(self) -> bool:
        return self.settled

    @property
    def channel(self) -> Wire:
        if self._wire.is_closed:
            raise BrokerRefused("the channel this delivery came on is gone")
        return self._wire

    async def ack(self, multiple: bool = False) -> None:
        self._settle("ack", multiple)

    async def nack(self, multiple: bool = False, requeue: bool = True) -> None:
        self._settle("return" if requeue else "drop", multiple)

    async def reject(self, requeue: bool = False) -> None:
        self._settle("requeue" if requeue else "drop", False)

    def _settle(self, how: str, multiple: bool) -> None:
        if self.settled:
            raise BrokerRefused(f"delivery {self.delivery_tag} is settled already")
        self._feed.settle(self.delivery_tag or 0, self._wire, how, multiple=multiple)
        self.settled = True


def _text(value: str | bytes | None) -> str | None:
    """A short string property: bytes that are not UTF-8 (read as they are by the tolerant
    decoding, shared/broker/wire.py) become the text of their repr, as aio-pika makes them."""
    return None if value is None else str(value)


def _seconds(expiration: str | None) -> float | None:
    """A per-message TTL as the wire has it (milliseconds, in text) in seconds."""
    try:
        return None if expiration is None else float(expiration) / 1000
    except ValueError:
        return None
