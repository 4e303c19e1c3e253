"""Robust connections to RabbitMQ, and what the server supports."""

from __future__ import annotations

from urllib.parse import unquote, urlsplit

import aio_pika
from aio_pika.abc import AbstractRobustConnection

from shared.broker.topology import supports_quorum
from shared.broker.wire import tolerate_undecodable_properties
from shared.errors import ServiceUnavailable, one_line
from shared.store.urls import redact


async def connect(url: str, *, timeout: float, name: str) -> AbstractRobustConnection:
    """Connect, or raise `ServiceUnavailable` with a one-line reason."""
    tolerate_undecodable_properties()  # no client's message may close this connection
    try:
        return await aio_pika.connect_robust(
            url, timeout=timeout, client_properties={"connection_name": name}
        )
    except (OSError, TimeoutError, aio_pika.exceptions.AMQPError) as exc:
        raise ServiceUnavailable(
            f"RabbitMQ at {redact(url)} is unreachable: {one_line(exc)}"
        ) from exc


def server_version(connection: AbstractRobustConnection) -> str:
    transport = connection.transport
    if transport is None:
        return "0"
    props = transport.connection.server_properties
    version = props.get("version", b"0")
    return version.decode() if isinstance(version, bytes) else str(version)


def quorum_available(connection: AbstractRobustConnection) -> bool:
    return supports_quorum(server_version(connection))


def login_user(url: str) -> str | None:
    """The broker user a URL logs in as: what RabbitMQ checks each message's `user_id` against,
    and what every publisher sets it to (shared/broker/senders.py). With `auth=external` the
    client certificate names the user, and the URL must name the same (`amqps://NAME@host/…`)."""
    parts = urlsplit(url)
    return unquote(parts.username) if parts.username else None
