"""The memory broker's adapter of the broker port (shared/broker/port.py): connections, and the
confirming senders and queue admins opened from them, directly over the broker model
(server.py); feeds and their deliveries are in channels.py. No client library in between: the
model answers what RabbitMQ would, and this module says it in the port's words.

A connection behaves as RabbitMQ's adapter's robust one: through a broker outage
(`MemoryBroker.outage`, which calls `link`) it keeps its channels and their consumers, loses
the deliveries they held (returned, counted; settling one fails), refuses work, and comes back
with the broker, calling its `on_reconnect` callbacks. `sever` is a process dying.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from shared.broker.memory.channels import Channel, MemoryDelivery, MemoryFeed, refusals
from shared.broker.memory.objects import Properties, Refused, encode
from shared.broker.memory.server import MemoryBroker
from shared.broker.port import (
    Arguments,
    BrokerInfo,
    BrokerUnavailable,
    ExchangeKind,
    Outgoing,
)
from shared.broker.wire import tolerate_undecodable_properties
from shared.errors import PublishError, PublishRejected, PublishUnroutable

if TYPE_CHECKING:
    from shared.broker import port

log = logging.getLogger(__name__)

Opened = TypeVar("Opened", bound=Channel)


def connect(broker: MemoryBroker, user: str, *, name: str = "") -> MemoryConnection:
    """A connection to `broker` as broker user `user` (up once the broker is)."""
    return MemoryConnection(broker, user, name=name)


class MemoryConnection:
    """A connection to a `MemoryBroker` as user `user` (port.Connection)."""

    def __init__(self, broker: MemoryBroker, user: str, *, name: str = "") -> None:
        self.broker = broker
        self.user = user
        self.name = name
        self.is_closed = False
        self._up = not broker.down
        self._channels: list[Channel] = []
        self._on_reconnect: list[Callable[[], None]] = []
        tolerate_undecodable_properties()  # the properties are decoded as from a socket
        broker.attach(self)

    @property
    def info(self) -> BrokerInfo:
        return BrokerInfo(MemoryBroker.VERSION, f"amqp://{self.user}@memory/", self.user)

    @property
    def connected(self) -> bool:
        return self._up and not self.is_closed

    async def sender(self, *, timeout: float) -> MemorySender:
        return await self._open(MemorySender(self, timeout))

    async def feed(self, *, prefetch: int) -> MemoryFeed:
        return await self._open(MemoryFeed(self, prefetch))

    async def admin(self) -> MemoryAdmin:
        """Opened without the broker, as RabbitMQ's adapter opens its admin: each call needs
        the broker (`BrokerUnavailable` while it is out, or once the connection is closed)."""
        admin = MemoryAdmin(self)
        if not self.is_closed:
            self._channels.append(admin)
        return admin

    async def _open(self, channel: Opened) -> Opened:
        await channel.round_trip()  # the broker's answer
        self._channels.append(channel)
        return channel

    def on_reconnect(self, callback: Callable[[], None]) -> Callable[[], None]:
        self._on_reconnect.append(callback)
        return lambda: self._forget_callback(callback)

    def _forget_callback(self, callback: Callable[[], None]) -> None:
        if callback in self._on_reconnect:
            self._on_reconnect.remove(callback)

    def check(self) -> None:
        """Raise `BrokerUnavailable` unless the connection is up."""
        if self.is_closed:
            raise BrokerUnavailable(f"the connection {self.name or self.user!r} is closed")
        if not self._up:
            raise BrokerUnavailable("the broker is unavailable: the connection is being restored")

    def link(self, up: bool) -> None:
        """The broker went away or came back (`MemoryBroker.outage`): the channels lose what
        they held, or get a new wire; coming back calls the `on_reconnect` callbacks."""
        if self.is_closed:
            return
        restored = up and not self._up
        self._up = up
        for channel in list(self._channels):
            channel.relink(up)
        if restored:
            for callback in list(self._on_reconnect):
                _call(callback)

    def forget(self, channel: Channel) -> None:
        """A channel closed."""
        if channel in self._channels:
            self._channels.remove(channel)

    async def close(self) -> None:
        """Close it (a process stopping)."""
        self.sever()

    def sever(self) -> None:
        """Gone at once (a process dying, or stopping: the broker cannot tell them apart):
        its channels return what they held, and its exclusive queues go."""
        if self.is_closed:
            return
        self.is_closed = True
        for channel in list(self._channels):
            channel.drop()
        self.broker.detach(self)


def _call(callback: Callable[[], None]) -> None:
    """A reconnection callback: one that fails does not keep the others from being called."""
    try:
        callback()
    except Exception:
        log.exception("a reconnection callback failed")


class MemorySender(Channel):
    """A confirming channel (port.Sender): the broker model answers each publish at once."""

    def __init__(self, connection: MemoryConnection, timeout: float) -> None:
        super().__init__(connection)
        self._timeout = timeout

    async def publish(self, message: Outgoing, *, exchange: str, routing_key: str) -> None:
        """Publish, mandatory. A `user_id` the message names must be the connection's user
        (the broker checks it); none is added, as RabbitMQ adds none."""
        target = f"{exchange or '(default)'}/{routing_key}"
        header = _header(message)  # encoded as sent, before the wait
        try:
            async with asyncio.timeout(self._timeout):
                await self.round_trip()
            outcome = self.broker.publish_as(
                self.connection.user, exchange, routing_key, message.body, header
            )
        except (BrokerUnavailable, TimeoutError) as exc:
            raise PublishError(f"publishing to {target} failed: {exc!r}") from exc
        except Refused as refused:
            raise PublishError(f"the broker refused the publish to {target}: {refused}") from None
        if outcome == "unroutable":
            raise PublishUnroutable(f"no queue takes messages for {target}")
        if outcome == "rejected":
            raise PublishRejected(f"the broker refused the message for {target} (queue full)")


def _header(message: Outgoing) -> bytes:
    """The message's properties as they travel (the broker model keeps them so)."""
    expiration = None if message.expiration is None else str(int(message.expiration * 1000))
    props = Properties(
        content_type=message.content_type,
        correlation_id=message.correlation_id,
        reply_to=message.reply_to,
        expiration=expiration,
        message_id=message.message_id,
        timestamp=message.timestamp,
        message_type=message.type,
        user_id=message.user_id,
        app_id=message.app_id,
        headers=dict(message.headers),
        delivery_mode=2 if message.persistent else 1,
        priority=0,
    )
    return encode(props, len(message.body))


class MemoryAdmin(Channel):
    """Declaring and inspecting the broker's objects (port.QueueAdmin). A refusal leaves it
    open, as the port asks."""

    async def declare_exchange(self, name: str, kind: ExchangeKind) -> None:
        await self.round_trip()
        with refusals():
            self.broker.declare_exchange(name, kind.value)

    async def declare_queue(
        self,
        name: str,
        *,
        arguments: Arguments | None = None,
        durable: bool = True,
        exclusive: bool = False,
        auto_delete: bool = False,
    ) -> None:
        await self.round_trip()
        with refusals():
            self.broker.declare_queue(
                name,
                owner=self.connection,
                durable=durable,
                auto_delete=auto_delete,
                exclusive=exclusive,
                arguments=dict(arguments or {}),
            )

    async def bind(self, queue: str, exchange: str, routing_key: str = "") -> None:
        await self.round_trip()
        with refusals():
            self.broker.bind(queue, exchange, routing_key, self.connection)

    async def depth(self, name: str) -> int:
        await self.round_trip()
        with refusals():
            return len(self.broker.queue(name, self.connection).ready)

    async def purge(self, name: str) -> int:
        await self.round_trip()
        with refusals():
            return self.broker.purge(name, self.connection)

    async def has_exchange(self, name: str) -> bool:
        await self.round_trip()
        return name in self.broker.exchanges

    async def delete(self, name: str, *, exchange: bool = False) -> int:
        await self.round_trip()
        if exchange:
            self.broker.delete_exchange(name)
            return 0
        if name in self.broker.queues:
            with refusals():  # another connection's exclusive queue is not ours to delete
                self.broker.queue(name, self.connection)
        return self.broker.delete_queue(name)


if TYPE_CHECKING:  # the project's `mypy` run (its packages, not tests/) checks this

    def _implements_the_port(
        connection: MemoryConnection,
        sender: MemorySender,
        feed: MemoryFeed,
        admin: MemoryAdmin,
        delivery: MemoryDelivery,
    ) -> tuple[port.Connection, port.Sender, port.Feed, port.QueueAdmin, port.Incoming]:
        return connection, sender, feed, admin, delivery
