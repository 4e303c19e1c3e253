"""The RabbitMQ adapter leaves no channel open behind a refusal (shared/broker/rabbitmq/adapter.py).

A robust channel that the broker closes (a passive declare of a missing queue, a consume of
one) reopens itself in the background unless its owner closes it through aio-pika; dropped
instead, it stays open and is restored after every reconnection. An API following a status
queue that submission has not declared yet looks again every couple of seconds: one channel
leaked a look reached the connection's channel limit within the hour (review of issue 34)."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest

from shared.broker.port import QueueMissing
from shared.broker.rabbitmq import RabbitConnection, connect
from tests.conftest import RABBITMQ_URL, service_missing

pytestmark = pytest.mark.rabbitmq

LOOKS = 6
WATCH_S = 2.0
"""How long the count is watched after the looks: aio-pika reopens a channel the broker closed
within a few tenths of a second."""


def open_channels(connection: RabbitConnection) -> int:
    """The channels open on the connection, as its client counts them (aiormq's table)."""
    raw = connection._connection  # the aio-pika connection below the adapter
    assert raw.transport is not None
    return len(raw.transport.connection.channels)


async def most_channels_within(connection: RabbitConnection, seconds: float) -> int:
    """The most channels open at any look over `seconds` (a window to see a late reopen in,
    not a wait for something to happen)."""
    most = open_channels(connection)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        await asyncio.sleep(0.05)
        most = max(most, open_channels(connection))
    return most


async def test_feeds_and_admins_refused_over_a_missing_queue_leave_no_channel() -> None:
    try:
        connection = await connect(RABBITMQ_URL, timeout=5, name="channel-leak")
    except Exception as exc:
        service_missing("RabbitMQ", exc)
    missing = f"missing-{uuid.uuid4().hex[:8]}"
    try:
        before = open_channels(connection)

        async def take(_: object) -> None:
            return None

        for _ in range(LOOKS):
            feed = await connection.feed(prefetch=1)
            with pytest.raises(QueueMissing):
                await feed.consume(missing, take, ack=False, restore=False)
            await feed.close()
            feed = await connection.feed(prefetch=0)
            with pytest.raises(QueueMissing):
                await feed.get(missing)
            await feed.close()
            admin = await connection.admin()
            with pytest.raises(QueueMissing):
                await admin.depth(missing)
            await admin.close()
        assert await most_channels_within(connection, WATCH_S) <= before
    finally:
        await connection.close()
