"""Publishing with confirms: a message the broker did not take is an error the caller sees."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from shared.broker.port import Connection, Outgoing, Sender
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
) -> Outgoing:
    """A persistent message with the properties every orderflow message carries."""
    return Outgoing(
        contract.to_json(),
        message_id=message_id,
        correlation_id=correlation_id,
        reply_to=reply_to,
        type=contract.message_type.value,
        content_type=CONTENT_TYPE,
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

    async def publish_raw(self, message: Outgoing, *, exchange: str, routing_key: str) -> None: ...

    async def close(self) -> None: ...


class Publisher:
    """Publishes contracts (and copies of messages) with confirms, as the connection's user:
    every message goes out with that user as its `user_id`, which the broker checks, so
    receivers know who sent it (shared/broker/senders.py). Safe to share between tasks."""

    def __init__(self, sender: Sender, *, user_id: str | None = None) -> None:
        self._sender = sender
        self._user_id = user_id

    @classmethod
    async def open(cls, connection: Connection, *, timeout: float) -> Publisher:
        """A publisher on a confirming channel of its own (the RabbitMQ adapter's renews itself
        after a refusal); each publish waits at most `timeout` for its confirm."""
        return cls(await connection.sender(timeout=timeout), user_id=connection.info.user)

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

    async def publish_raw(self, message: Outgoing, *, exchange: str, routing_key: str) -> None:
        """Publish and wait for the confirm; raise a `PublishError` unless the broker took it."""
        if message.user_id is None:
            message.user_id = self._user_id
        await self._sender.publish(message, exchange=exchange, routing_key=routing_key)
