"""Publishing with confirms: a message the broker did not take is an error the caller sees."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from functools import partial
from typing import Any, Protocol

import aio_pika
from aio_pika.abc import AbstractChannel

from shared.broker.connection import login_user
from shared.broker.rabbitmq.sender import RabbitSender
from shared.domain.messages import Contract
from shared.tracing import publish_span

CONTENT_TYPE = "application/json"


def build_message(
    contract: Contract,
    *,
    message_id: str,
    correlation_id: str | None = None,
    reply_to: str | None = None,
    headers: Mapping[str, Any] | None = None,
) -> aio_pika.Message:
    """A persistent message with the properties every orderflow message carries."""
    return aio_pika.Message(
        contract.to_json(),
        message_id=message_id,
        correlation_id=correlation_id,
        reply_to=reply_to,
        type=contract.message_type.value,
        content_type=CONTENT_TYPE,
        delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
        headers=dict(headers or {}),
    )


class Publishing(Protocol):
    """What the processes publish through: a `Publisher`, or a fault drill wrapped around one
    (shared/broker/drills.py, chosen by the bootstrap)."""

    async def publish(
        self,
        contract: Contract,
        *,
        exchange: str,
        routing_key: str,
        message_id: str,
        correlation_id: str | None = None,
        reply_to: str | None = None,
        headers: Mapping[str, Any] | None = None,
    ) -> None: ...

    async def publish_raw(
        self, message: aio_pika.Message, *, exchange: str, routing_key: str
    ) -> None: ...

    async def close(self) -> None: ...


class Publisher:
    """Publishes with confirms (shared/broker/rabbitmq/sender.py: one confirming channel,
    renewed after a refusal). Safe to share between tasks of one process."""

    def __init__(
        self,
        channel: AbstractChannel,
        *,
        timeout: float,
        user_id: str | None = None,
        reopen: Callable[[], Awaitable[AbstractChannel]] | None = None,
    ) -> None:
        self._sender = RabbitSender(channel, timeout=timeout, reopen=reopen)
        self._user_id = user_id

    @classmethod
    async def open(
        cls, connection: aio_pika.abc.AbstractConnection, *, timeout: float
    ) -> Publisher:
        """Every message goes out with the connection's user as its `user_id`, which the broker
        checks, so receivers know who sent it (shared/broker/senders.py)."""
        reopen = partial(_confirming_channel, connection)
        return cls(
            await reopen(),
            timeout=timeout,
            user_id=login_user(str(getattr(connection, "url", ""))),
            reopen=reopen,
        )

    async def close(self) -> None:
        await self._sender.close()

    async def publish(
        self,
        contract: Contract,
        *,
        exchange: str,
        routing_key: str,
        message_id: str,
        correlation_id: str | None = None,
        reply_to: str | None = None,
        headers: Mapping[str, Any] | None = None,
    ) -> None:
        carried = dict(headers or {})
        # Inside an order's span: a span of its own, whose context the message carries.
        with publish_span(exchange, routing_key, carried):
            message = build_message(
                contract,
                message_id=message_id,
                correlation_id=correlation_id,
                reply_to=reply_to,
                headers=carried,
            )
            await self.publish_raw(message, exchange=exchange, routing_key=routing_key)

    async def publish_raw(
        self, message: aio_pika.Message, *, exchange: str, routing_key: str
    ) -> None:
        """Publish and wait for the confirm; raise a `PublishError` unless the broker took it."""
        if message.user_id is None:
            message.user_id = self._user_id
        await self._sender.send(message, exchange=exchange, routing_key=routing_key)


async def _confirming_channel(connection: aio_pika.abc.AbstractConnection) -> AbstractChannel:
    return await connection.channel(publisher_confirms=True, on_return_raises=True)
