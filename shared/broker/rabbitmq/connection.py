"""Robust connections to RabbitMQ, failing over between the nodes of a cluster, and what the
server supports."""

from __future__ import annotations

import logging
import random
from typing import Any

import aio_pika
from aio_pika.abc import AbstractRobustConnection
from aio_pika.robust_connection import RobustConnection
from tenacity import (
    AsyncRetrying,
    RetryError,
    retry_if_exception_type,
    stop_after_attempt,
    wait_none,
)
from yarl import URL

from shared.broker.urls import NodeRotation, broker_urls
from shared.broker.wire import tolerate_undecodable_properties
from shared.errors import ConfigurationError, ServiceUnavailable, one_line
from shared.store.urls import redact

log = logging.getLogger(__name__)

RECONNECT_INTERVAL_S = 1.0
"""Pause between two reconnection attempts of a connection that was lost (aio-pika's default is
5 s): each attempt goes to the next node, so a node that is down costs this much, once."""


class FailoverConnection(RobustConnection):
    """aio-pika's robust connection (channels, consumers and declarations restored on
    reconnecting), but each reconnection attempt goes to the next node of the list.

    aio-pika's reconnection loop clears `transport` right before each attempt, which connects
    to `self.url`: the setter below is where the next node is chosen. Pinned to aio-pika's
    locked version; tests/contract/test_broker_failover.py and the cluster system test notice
    a change."""

    def __init__(self, url: URL, *, rotation: NodeRotation, **kwargs: Any) -> None:
        self._rotation = rotation
        self._transport: Any = None
        super().__init__(url, **kwargs)

    @property
    def transport(self) -> Any:
        return self._transport

    @transport.setter
    def transport(self, value: Any) -> None:
        previous, self._transport = self._transport, value
        if value is not None or getattr(self, "_close_called", False):
            return
        # Cleared for an attempt: after a lost connection (`previous`), or after an attempt
        # that failed (connected once before; the very first attempt keeps the chosen node).
        if previous is not None or getattr(self, "connection_attempt", 0) > 0:
            self._next_node()

    async def _on_connected(self) -> None:
        await super()._on_connected()
        if self.connection_attempt > 1:  # counted by the call above: this was a reconnection
            log.info("RabbitMQ: reconnected", extra={"node": redact(str(self.url))})

    def _next_node(self) -> None:
        url = self._rotation.next()
        self.url = URL(url)
        log.info("RabbitMQ: connecting to the next node", extra={"node": redact(url)})


async def connect(
    url: str, *, timeout: float, name: str, rng: random.Random | None = None
) -> AbstractRobustConnection:
    """Connect to one node of `url` (one URL, or a comma-separated list of a cluster's nodes),
    trying each once from a random start; ServiceUnavailable with a one-line reason if none
    answers (the caller's retry, e.g. `orderflow serve`'s, tries them all again later)."""
    tolerate_undecodable_properties()  # no client's message may close this connection
    try:
        urls = broker_urls(url)
    except ValueError as exc:
        raise ConfigurationError(str(exc)) from None
    rotation = NodeRotation(urls, rng=rng)
    failures: list[str] = []
    try:
        async for attempt in AsyncRetrying(
            stop=stop_after_attempt(len(rotation.urls)),
            wait=wait_none(),
            retry=retry_if_exception_type(ServiceUnavailable),
        ):
            with attempt:
                return await _connect_node(rotation, timeout=timeout, name=name, failures=failures)
    except RetryError:
        pass
    if len(failures) == 1:
        raise ServiceUnavailable(f"RabbitMQ at {failures[0]}")
    raise ServiceUnavailable(f"no RabbitMQ node is reachable: {'; '.join(failures)}")


async def _connect_node(
    rotation: NodeRotation, *, timeout: float, name: str, failures: list[str]
) -> AbstractRobustConnection:
    node = rotation.next()
    connection = FailoverConnection(
        URL(node),
        rotation=rotation,
        client_properties={"connection_name": name},
        reconnect_interval=RECONNECT_INTERVAL_S,
    )
    try:
        await connection.connect(timeout=timeout)
    except (OSError, TimeoutError, aio_pika.exceptions.AMQPError) as exc:
        await connection.close()
        failures.append(f"{redact(node)} is unreachable: {one_line(exc)}")
        raise ServiceUnavailable(failures[-1]) from exc
    return connection


def connected_node(connection: AbstractRobustConnection) -> str:
    """The node a connection is on now, its password masked."""
    return redact(str(getattr(connection, "url", "")))


def server_version(connection: AbstractRobustConnection) -> str:
    transport = connection.transport
    if transport is None:
        return "0"
    props = transport.connection.server_properties
    version = props.get("version", b"0")
    return version.decode() if isinstance(version, bytes) else str(version)
