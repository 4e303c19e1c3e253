"""Connections, channels, queues and exchanges of the memory broker, as aio-pika shapes them.

orderflow's broker layer (publisher, consumer, private queues, topology) is written against
aio-pika's robust connection; these classes answer the part of that interface it uses, with
aio-pika's own `IncomingMessage` and aiormq's exceptions, so the same code runs on either
broker. A channel behaves as a robust one: an error refuses the operation and leaves the
channel open, and through a broker outage it keeps its consumers and gets them back when the
broker returns (the deliveries it held are returned, and acking one of them fails, as on a
channel that was replaced).
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Awaitable, Callable
from types import SimpleNamespace
from typing import Any, cast

import aio_pika
import aiormq.exceptions as amqp
from aio_pika.abc import AbstractIncomingMessage, AbstractRobustConnection
from aiormq.abc import DeliveredMessage
from pamqp.commands import Basic
from pamqp.header import ContentHeader

from shared.broker.memory.handles import Declared, MemoryExchange, MemoryQueue, nothing
from shared.broker.memory.objects import (
    NOT_FOUND,
    PRECONDITION_FAILED,
    Consumer,
    Properties,
    Queue,
    Refused,
    Stored,
    encode,
)
from shared.broker.memory.server import MemoryBroker
from shared.broker.wire import tolerate_undecodable_properties

Callback = Callable[[AbstractIncomingMessage], Awaitable[Any]]
_ERRORS: dict[int, type[amqp.ChannelClosed]] = {
    NOT_FOUND: amqp.ChannelNotFoundEntity,
    PRECONDITION_FAILED: amqp.ChannelPreconditionFailed,
}


def _raised(refused: Refused) -> amqp.ChannelClosed:
    return _ERRORS.get(refused.code, amqp.ChannelLockedResource)(refused.text)


def connect(broker: MemoryBroker, user: str, *, name: str = "") -> AbstractRobustConnection:
    """A connection to `broker` as `user`, typed as what orderflow's broker layer takes: the
    part of aio-pika's robust connection it uses is what `MemoryConnection` answers (mypy
    cannot check that; the broker contract suite, run on both brokers, does)."""
    return cast(AbstractRobustConnection, MemoryConnection(broker, user, name=name))


class MemoryConnection:
    """A connection to a `MemoryBroker` as broker user `user`."""

    def __init__(self, broker: MemoryBroker, user: str, *, name: str = "") -> None:
        self.broker = broker
        self.user = user
        self.name = name
        self.url = f"amqp://{user}@memory/"
        self.connected = asyncio.Event()
        self.is_closed = False
        self.transport = SimpleNamespace(
            connection=SimpleNamespace(server_properties={"version": MemoryBroker.VERSION.encode()})
        )
        self._channels: list[MemoryChannel] = []
        tolerate_undecodable_properties()  # the properties are decoded as from a socket
        broker.attach(self)
        self.link(not broker.down)

    async def channel(
        self, publisher_confirms: bool = True, on_return_raises: bool = False, **_: Any
    ) -> MemoryChannel:
        self._check()
        channel = MemoryChannel(self)
        self._channels.append(channel)
        return channel

    def link(self, up: bool) -> None:
        """The broker went away or came back: a robust connection keeps its channels and
        their consumers, and loses the deliveries it held."""
        if up:
            self.connected.set()
        else:
            self.connected.clear()
        for channel in self._channels:
            channel.relink(up)

    def _check(self) -> None:
        if self.is_closed or not self.connected.is_set():
            raise amqp.ChannelInvalidStateError("the connection is closed")

    async def close(self) -> None:
        """Close it (a process stopping)."""
        self.sever()

    def sever(self) -> None:
        """Gone at once (a process dying, or stopping: the broker cannot tell them apart)."""
        if self.is_closed:
            return
        self.is_closed = True
        self.connected.clear()
        for channel in list(self._channels):
            channel.drop()
        self.broker.detach(self)


class _Wire:
    """One incarnation of a channel on the wire: what an `IncomingMessage` acks through. A
    channel gets a new one when the broker comes back; acks on the old one fail."""

    connection = SimpleNamespace(basic_nack=True)
    """The server's capabilities, as aio-pika asks them before a nack."""

    def __init__(self, channel: MemoryChannel) -> None:
        self.channel = channel
        self.is_closed = False

    def _check(self) -> MemoryChannel:
        if self.is_closed:
            raise amqp.ChannelInvalidStateError("the channel is closed")
        return self.channel

    async def basic_ack(self, delivery_tag: int, multiple: bool = False) -> None:
        channel = self._check()
        if multiple:  # every delivery of the channel held up to the tag, as AMQP has it
            channel.settle_up_to(delivery_tag, "ack")
        else:
            channel.settle(delivery_tag, "ack")

    async def basic_nack(
        self, delivery_tag: int | None = None, multiple: bool = False, requeue: bool = True
    ) -> None:
        self._check().settle(delivery_tag, "return" if requeue else "drop")

    async def basic_reject(self, delivery_tag: int, *, requeue: bool = True) -> None:
        self._check().settle(delivery_tag, "requeue" if requeue else "drop")


class MemoryChannel:
    """A channel (its own underlay: aio-pika's and aiormq's methods are both here)."""

    def __init__(self, connection: MemoryConnection) -> None:
        self.connection = connection
        self.broker = connection.broker
        self.is_closed = False
        self.prefetch = 0
        self.consumers: dict[str, Consumer] = {}
        self._wire = _Wire(self)
        self._held: dict[int, tuple[Queue, Consumer, Stored]] = {}

    # -- the channel itself
    async def get_underlay_channel(self) -> MemoryChannel:
        self._check()
        return self

    def _check(self) -> None:
        if self.is_closed:
            raise amqp.ChannelInvalidStateError("the channel is closed")
        self.connection._check()

    async def _round_trip(self) -> None:
        self._check()
        await asyncio.sleep(0)
        self._check()

    async def set_qos(self, prefetch_count: int = 0, **_: Any) -> None:
        self.prefetch = prefetch_count

    async def close(self) -> None:
        self.drop()

    def drop(self) -> None:
        """Closed: its consumers go, and every delivery it held goes back to its queue."""
        if self.is_closed:
            return
        self.is_closed = True
        for consumer in list(self.consumers.values()):
            self.broker.unsubscribe(consumer)
        self.consumers.clear()
        self.relink(False)
        if self in self.connection._channels:
            self.connection._channels.remove(self)

    def relink(self, up: bool) -> None:
        if up:
            if self._wire.is_closed and not self.is_closed:
                self._wire = _Wire(self)
            return
        self._wire.is_closed = True
        held, self._held = self._held, {}
        for tag, (queue, consumer, message) in held.items():
            consumer.in_hand.discard(tag)
            self.broker.give_back(queue, message)
        for queue, _, _ in held.values():
            self.broker.wake(queue)

    # -- exchanges and queues (aio-pika's names)
    @property
    def default_exchange(self) -> MemoryExchange:
        return MemoryExchange(self, "")

    async def get_exchange(self, name: str, *, ensure: bool = True) -> MemoryExchange:
        if ensure:
            await self._round_trip()
            self._call(self.broker.exchange, name)
        return MemoryExchange(self, name)

    async def declare_exchange(
        self, name: str, type: aio_pika.ExchangeType | str = "direct", **_: Any
    ) -> MemoryExchange:
        await self._round_trip()
        kind = type.value if isinstance(type, aio_pika.ExchangeType) else str(type)
        self._call(self.broker.declare_exchange, name, kind)
        return MemoryExchange(self, name)

    async def get_queue(self, name: str, *, ensure: bool = True) -> MemoryQueue:
        if ensure:
            await self._round_trip()
            self._call(self.broker.queue, name, self.connection)
        return MemoryQueue(self, name)

    async def declare_queue(
        self, name: str | None = None, *, passive: bool = False, **settings: Any
    ) -> MemoryQueue:
        named, declared = await self._declare(name or "", passive=passive, **settings)
        queue = MemoryQueue(self, named)
        queue.declaration_result = declared
        return queue

    async def queue_declare(self, queue: str = "", **settings: Any) -> Declared:
        return (await self._declare(queue, **settings))[1]

    async def _declare(
        self,
        queue: str,
        *,
        passive: bool = False,
        durable: bool = False,
        exclusive: bool = False,
        auto_delete: bool = False,
        arguments: dict[str, Any] | None = None,
        **_: Any,
    ) -> tuple[str, Declared]:
        await self._round_trip()
        name = queue or f"amq.gen-{self.broker.next_tag()}"
        if passive:
            found = self._call(self.broker.queue, name, self.connection)
        else:
            found = self._call(
                self.broker.declare_queue,
                name,
                owner=self.connection,
                durable=durable,
                auto_delete=auto_delete,
                exclusive=exclusive,
                arguments=dict(arguments or {}),
            )
        return name, Declared(len(found.ready), len(found.consumers))

    async def queue_bind(self, queue: str, exchange: str, routing_key: str = "", **_: Any) -> None:
        await self._round_trip()
        self._call(self.broker.bind, queue, exchange, routing_key, self.connection)

    async def queue_delete(self, queue_name: str, **_: Any) -> Declared:
        await self._round_trip()
        return Declared(self.broker.delete_queue(queue_name), 0)

    async def exchange_delete(self, exchange_name: str, **_: Any) -> None:
        await self._round_trip()
        self.broker.delete_exchange(exchange_name)

    def _call(self, operation: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        try:
            return operation(*args, **kwargs)
        except Refused as refused:
            raise _raised(refused) from None

    # -- consuming
    async def consume(self, queue: str, callback: Callback, *, no_ack: bool) -> str:
        await self._round_trip()
        tag = f"ctag-{self.broker.next_tag()}"

        async def deliver(message: Stored, delivery_tag: int) -> None:
            await callback(self._incoming(message, tag, delivery_tag, no_ack))

        consumer = Consumer(
            tag,
            queue,
            self,
            deliver,
            self.prefetch or 2**31,
            no_ack,
            contextvars.copy_context(),
        )
        self._call(self.broker.subscribe, consumer)
        self.consumers[tag] = consumer
        return tag

    async def cancel(self, tag: str) -> None:
        await self._round_trip()
        consumer = self.consumers.pop(tag, None)
        if consumer is not None:
            self.broker.unsubscribe(consumer)

    def hold(self, tag: int, queue: Queue, consumer: Consumer, message: Stored) -> None:
        self._held[tag] = (queue, consumer, message)

    def settle(self, tag: int | None, how: str) -> None:
        held = self._held.pop(tag or 0, None)
        if held is None:
            raise amqp.ChannelInvalidStateError(f"unknown delivery tag {tag}")
        queue, consumer, message = held
        self.broker.settle(queue, consumer, message, tag or 0, how)

    def settle_up_to(self, tag: int, how: str) -> None:
        if tag not in self._held:
            raise amqp.ChannelInvalidStateError(f"unknown delivery tag {tag}")
        for held in sorted(t for t in self._held if t <= tag):
            self.settle(held, how)

    def _incoming(
        self, message: Stored, consumer_tag: str | None, tag: int, no_ack: bool
    ) -> aio_pika.IncomingMessage:
        props = self.broker.delivered(message)
        frame = Basic.Deliver(
            consumer_tag, tag, message.redelivered, message.exchange, message.routing_key
        )
        header = ContentHeader(body_size=len(message.body), properties=props)
        return aio_pika.IncomingMessage(
            DeliveredMessage(delivery=frame, header=header, body=message.body, channel=self._wire),  # type: ignore[arg-type]
            no_ack=no_ack,
        )

    async def get(self, queue: str, *, no_ack: bool) -> aio_pika.IncomingMessage | None:
        await self._round_trip()
        found: Queue = self._call(self.broker.queue, queue, self.connection)
        if not found.ready:
            return None
        message = found.ready.popleft()
        tag = self.broker.next_tag()
        if not no_ack:
            holder = Consumer("", queue, self, nothing, 1, False, contextvars.copy_context())
            self.hold(tag, found, holder, message)
        return self._incoming(message, None, tag, no_ack)

    # -- publishing
    async def basic_publish(
        self,
        body: bytes,
        *,
        exchange: str = "",
        routing_key: str = "",
        properties: Properties | None = None,
        mandatory: bool = False,
        **_: Any,
    ) -> None:
        """Publish and wait for the broker's confirm (aiormq's name)."""
        props = properties or Properties()
        if props.user_id is not None and props.user_id != self.connection.user:
            raise amqp.ChannelPreconditionFailed(
                f"PRECONDITION_FAILED - user_id property set to '{props.user_id}' but "
                f"authenticated user was '{self.connection.user}'"
            )
        header = encode(props, len(body))  # before the round trip, as a client sends it
        await self._round_trip()
        sender = self.connection.user
        outcome = self._call(self.broker.publish, exchange, routing_key, body, header, sender)
        if outcome == "unroutable" and mandatory:
            returned = Basic.Return(312, "NO_ROUTE", exchange, routing_key)
            content = ContentHeader(body_size=len(body), properties=props)
            raise amqp.PublishError(
                DeliveredMessage(returned, content, body, self._wire),  # type: ignore[arg-type]
                returned,
            )
        if outcome == "rejected":
            raise amqp.DeliveryError(None, Basic.Nack(0))
