"""Publishing with confirms: a message the broker did not take is an error the caller sees."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any, Protocol

import aio_pika
import aiormq
from aio_pika.abc import AbstractChannel, AbstractExchange

from shared.broker.connection import login_user
from shared.domain.messages import Contract
from shared.errors import PublishError, PublishRejected, PublishUnroutable
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
    """Publishes on one confirming channel. Safe to share between tasks of one process."""

    def __init__(
        self, channel: AbstractChannel, *, timeout: float, user_id: str | None = None
    ) -> None:
        self._channel = channel
        self._user_id = user_id
        self._timeout = timeout
        self._exchanges: dict[str, AbstractExchange] = {}

    @classmethod
    async def open(
        cls, connection: aio_pika.abc.AbstractConnection, *, timeout: float
    ) -> Publisher:
        """Every message goes out with the connection's user as its `user_id`, which the broker
        checks, so receivers know who sent it (shared/broker/senders.py)."""
        channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
        return cls(
            channel, timeout=timeout, user_id=login_user(str(getattr(connection, "url", "")))
        )

    async def close(self) -> None:
        await self._channel.close()

    async def _exchange(self, name: str) -> AbstractExchange:
        if name == "":
            return self._channel.default_exchange
        if name not in self._exchanges:
            self._exchanges[name] = await self._channel.get_exchange(name, ensure=False)
        return self._exchanges[name]

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
        target = f"{exchange or '(default)'}/{routing_key}"
        if message.user_id is None:
            message.user_id = self._user_id
        try:
            # The whole of it within the timeout: a robust channel whose connection is being
            # restored waits for it before it publishes, for as long as that takes.
            async with asyncio.timeout(self._timeout):
                ex = await self._exchange(exchange)
                await ex.publish(message, routing_key, mandatory=True, timeout=self._timeout)
        except aiormq.exceptions.PublishError as exc:
            raise PublishUnroutable(f"no queue takes messages for {target}") from exc
        except aiormq.exceptions.DeliveryError as exc:
            raise PublishRejected(
                f"the broker refused the message for {target} (queue full or unavailable)"
            ) from exc
        except TimeoutError as exc:
            raise PublishError(
                f"no confirm for {target} within {self._timeout}s (the broker did not answer, "
                "or the connection to it was being restored)"
            ) from exc
        except (aiormq.exceptions.AMQPError, ConnectionError, RuntimeError) as exc:
            raise PublishError(f"publishing to {target} failed: {exc!r}") from exc
