"""The handles a channel gives out: an exchange to publish to, a queue to consume from or take
one message of, and what a declaration answers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import aio_pika

from shared.broker.memory.objects import Stored

if TYPE_CHECKING:
    from shared.broker.memory.client import Callback, MemoryChannel


@dataclass(frozen=True)
class Declared:
    """What a queue declaration answers."""

    message_count: int
    consumer_count: int


async def nothing(message: Stored, tag: int) -> None:
    """The callback of a delivery taken with `get` (nothing is called)."""


class MemoryExchange:
    def __init__(self, channel: MemoryChannel, name: str) -> None:
        self.channel = channel
        self.name = name

    async def publish(
        self,
        message: aio_pika.abc.AbstractMessage,
        routing_key: str,
        *,
        mandatory: bool = True,
        timeout: float | None = None,
        **_: Any,
    ) -> None:
        await self.channel.basic_publish(
            message.body,
            exchange=self.name,
            routing_key=routing_key,
            properties=message.properties,
            mandatory=mandatory,
        )


class MemoryQueue:
    def __init__(self, channel: MemoryChannel, name: str) -> None:
        self.channel = channel
        self.name = name
        self.declaration_result = Declared(0, 0)

    async def consume(self, callback: Callback, no_ack: bool = False, **_: Any) -> str:
        return await self.channel.consume(self.name, callback, no_ack=no_ack)

    async def cancel(self, consumer_tag: str, **_: Any) -> None:
        await self.channel.cancel(consumer_tag)

    async def bind(self, exchange: Any, routing_key: str | None = None, **_: Any) -> None:
        name = exchange if isinstance(exchange, str) else exchange.name
        key = self.name if routing_key is None else routing_key
        await self.channel.queue_bind(self.name, name, key)

    async def get(
        self, *, no_ack: bool = False, fail: bool = True, **_: Any
    ) -> aio_pika.IncomingMessage | None:
        message = await self.channel.get(self.name, no_ack=no_ack)
        if message is None and fail:
            raise aio_pika.exceptions.QueueEmpty(self.name)
        return message

    async def delete(self, **_: Any) -> Declared:
        return await self.channel.queue_delete(self.name)
