"""RabbitMQ behind the broker port (shared/broker/port.py), on aio-pika's robust connection: the
only place, with its neighbours in this package, that knows aio-pika.

Consumers are aio-pika's robust ones (restored after a reconnection) unless asked otherwise, and
their deliveries are aio-pika's messages as they come: those have the port's `Incoming` shape.
Administration runs on the channel below aio-pika's (aiormq's), so that nothing it declares or
looks up is replayed on a reconnection; after a refusal (which closes the channel) the admin
closes it for good and the next call opens another.

A channel is always closed through aio-pika, even one the broker closed already: a robust
channel the broker closed reopens itself in the background unless it is closed by its owner,
and one dropped without that stays open, restored after every reconnection (an API following
a status queue not declared yet would leak one a look, every couple of seconds)."""

from __future__ import annotations

import contextlib
import random
from collections.abc import Callable
from typing import Any

import aiormq
from aio_pika.abc import AbstractRobustChannel, AbstractRobustConnection, AbstractRobustQueue

from shared.broker.port import (
    Arguments,
    BrokerInfo,
    BrokerRefused,
    BrokerUnavailable,
    ExchangeKind,
    Incoming,
    QueueMismatch,
    QueueMissing,
    Take,
)
from shared.broker.rabbitmq import connection as links
from shared.broker.rabbitmq.sender import TRANSIENT, RabbitSender
from shared.broker.urls import login_user
from shared.errors import one_line


def refusal(exc: BaseException, what: str) -> Exception:
    """The port's error for what a channel operation raised."""
    text = f"{what}: {one_line(exc)}"
    if isinstance(exc, aiormq.exceptions.ChannelNotFoundEntity):
        return QueueMissing(text)
    if isinstance(
        exc,
        aiormq.exceptions.ChannelPreconditionFailed | aiormq.exceptions.ChannelLockedResource,
    ):
        return QueueMismatch(text, said=str(exc))
    if isinstance(exc, aiormq.exceptions.ChannelAccessRefused):
        return BrokerRefused(text)
    return BrokerUnavailable(text)


class RabbitFeed:
    """A robust channel that consumes, with its prefetch."""

    def __init__(self, channel: AbstractRobustChannel) -> None:
        self._channel = channel
        self._queues: dict[str, AbstractRobustQueue] = {}
        self._own: dict[str, AbstractRobustQueue] = {}
        self._taken: dict[str, AbstractRobustQueue] = {}
        """The queues `get` looked up, each once."""

    async def consume(
        self, queue: str, take: Take, *, ack: bool = True, restore: bool = True
    ) -> str:
        try:
            found = self._own.get(queue) or await self._channel.declare_queue(
                queue, passive=True, robust=restore
            )
            tag = await found.consume(take, no_ack=not ack, robust=restore)
        except TRANSIENT as exc:
            raise refusal(exc, f"consuming {queue}") from exc
        self._queues[tag] = found
        return tag

    async def own_queue(self, name: str, *, bind_to: str | None, routing_key: str = "") -> None:
        try:
            queue = await self._channel.declare_queue(
                name, exclusive=True, auto_delete=True, durable=False
            )
            if bind_to is not None:
                await queue.bind(bind_to, routing_key=routing_key)
        except TRANSIENT as exc:
            raise refusal(exc, f"declaring {name}") from exc
        self._own[name] = queue

    async def cancel(self, tag: str) -> None:
        queue = self._queues.pop(tag, None)
        if queue is None:
            return
        try:
            await queue.cancel(tag)
        except TRANSIENT as exc:
            self._queues[tag] = queue  # still subscribed, as far as anyone can tell
            raise refusal(exc, f"cancelling {tag}") from exc

    async def consuming(self, tag: str) -> bool:
        if tag not in self._queues or self._channel.is_closed:
            return False
        try:
            underlay = await self._channel.get_underlay_channel()
        except Exception:  # no channel below: reconnecting
            return False
        consumers = getattr(underlay, "consumers", None)  # aiormq's Channel has it
        return consumers is None or tag in consumers

    async def get(self, queue: str) -> Incoming | None:
        try:
            found = self._taken.get(queue)
            if found is None:
                found = await self._channel.declare_queue(queue, passive=True, robust=False)
                self._taken[queue] = found
            return await found.get(no_ack=False, fail=False)
        except TRANSIENT as exc:
            self._taken.pop(queue, None)
            raise refusal(exc, f"taking from {queue}") from exc

    async def close(self) -> None:
        with contextlib.suppress(Exception):  # closed by the broker already, or going
            await self._channel.close()


class RabbitAdmin:
    """Declarations and lookups on a channel of their own, below aio-pika's robust layer."""

    def __init__(self, connection: AbstractRobustConnection) -> None:
        self._connection = connection
        self._channel: AbstractRobustChannel | None = None

    async def _call(self, what: str, operation: Callable[[Any], Any]) -> Any:
        try:
            if self._channel is None or self._channel.is_closed:
                self._channel = await self._connection.channel()
            underlay = await self._channel.get_underlay_channel()
            return await operation(underlay)
        except TRANSIENT as exc:
            await self.close()  # a refusal closed it: the next call opens another
            raise refusal(exc, what) from exc

    async def declare_exchange(self, name: str, kind: ExchangeKind) -> None:
        await self._call(
            f"declaring exchange {name}",
            lambda ch: ch.exchange_declare(name, exchange_type=kind.value, durable=True),
        )

    async def declare_queue(
        self,
        name: str,
        *,
        arguments: Arguments | None = None,
        durable: bool = True,
        exclusive: bool = False,
        auto_delete: bool = False,
    ) -> None:
        await self._call(
            f"declaring queue {name}",
            lambda ch: ch.queue_declare(
                name,
                durable=durable,
                exclusive=exclusive,
                auto_delete=auto_delete,
                arguments=dict(arguments or {}),
            ),
        )

    async def bind(self, queue: str, exchange: str, routing_key: str = "") -> None:
        await self._call(
            f"binding {queue} to {exchange}",
            lambda ch: ch.queue_bind(queue, exchange, routing_key=routing_key),
        )

    async def depth(self, name: str) -> int:
        declared = await self._call(
            f"looking up queue {name}", lambda ch: ch.queue_declare(name, passive=True)
        )
        return int(declared.message_count or 0)

    async def purge(self, name: str) -> int:
        purged = await self._call(f"purging {name}", lambda ch: ch.queue_purge(name))
        return int(purged.message_count or 0)

    async def has_exchange(self, name: str) -> bool:
        try:
            await self._call(
                f"looking up exchange {name}",
                lambda ch: ch.exchange_declare(name, passive=True),
            )
        except QueueMissing:
            return False
        return True

    async def delete(self, name: str, *, exchange: bool = False) -> int:
        if exchange:
            await self._call(f"deleting exchange {name}", lambda ch: ch.exchange_delete(name))
            return 0
        deleted = await self._call(f"deleting queue {name}", lambda ch: ch.queue_delete(name))
        return int(deleted.message_count or 0)

    async def close(self) -> None:
        channel, self._channel = self._channel, None
        if channel is not None:
            with contextlib.suppress(Exception):  # closed by the broker already, or going
                await channel.close()


class RabbitConnection:
    """One robust connection to RabbitMQ (failing over between a cluster's nodes)."""

    def __init__(self, connection: AbstractRobustConnection) -> None:
        self._connection = connection

    @property
    def info(self) -> BrokerInfo:
        return BrokerInfo(
            version=links.server_version(self._connection),
            node=links.connected_node(self._connection),
            user=login_user(str(getattr(self._connection, "url", ""))),
        )

    @property
    def connected(self) -> bool:
        return self._connection.connected.is_set()

    async def sender(self, *, timeout: float) -> RabbitSender:
        async def confirming() -> Any:
            return await self._connection.channel(publisher_confirms=True, on_return_raises=True)

        try:
            return RabbitSender(await confirming(), timeout=timeout, reopen=confirming)
        except TRANSIENT as exc:
            raise refusal(exc, "opening a channel") from exc

    async def feed(self, *, prefetch: int) -> RabbitFeed:
        try:
            channel = await self._connection.channel()
            await channel.set_qos(prefetch_count=prefetch)
        except TRANSIENT as exc:
            raise refusal(exc, "opening a channel") from exc
        assert isinstance(channel, AbstractRobustChannel)
        return RabbitFeed(channel)

    async def admin(self) -> RabbitAdmin:
        return RabbitAdmin(self._connection)

    def on_reconnect(self, callback: Callable[[], None]) -> Callable[[], None]:
        def reconnected(*_: object) -> None:
            callback()

        self._connection.reconnect_callbacks.add(reconnected)
        return lambda: self._connection.reconnect_callbacks.discard(reconnected)

    async def close(self) -> None:
        await self._connection.close()


async def connect(
    url: str, *, timeout: float, name: str, rng: random.Random | None = None
) -> RabbitConnection:
    """Connect to one node of `url` (one URL, or a comma-separated list of a cluster's nodes);
    `ServiceUnavailable` with a one-line reason if none answers."""
    return RabbitConnection(await links.connect(url, timeout=timeout, name=name, rng=rng))
