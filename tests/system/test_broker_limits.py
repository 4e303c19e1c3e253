"""The generated definitions' limits, on the real RabbitMQ: imported into a vhost of this test's
own (through `infra/rabbitmq/render-definitions.sh` and `rabbitmqctl import_definitions`, as the
compose deployment loads them), they are the broker's: read back with `rabbitmqctl`, and a user
past its connection or channel limit, or the vhost past its queue limit, is refused. The vhost and
the users are deleted afterwards, also on failure.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace

import aio_pika
import aiormq
import pytest

from deployment.rabbitmq import BrokerLimits, queues_needed
from shared.broker.topology import Names
from tests.support.vhost import Broker, rabbitmqctl, scratch_vhost
from tests.support.waiting import eventually

pytestmark = [pytest.mark.rabbitmq]

SMALL = BrokerLimits(
    vhost_max_connections=20,
    vhost_max_queues=1,  # raised below to the least the generator takes for one application
    service_max_connections=4,
    service_max_channels=8,
    app_max_connections=2,
    app_max_channels=3,
)
LIMITS = replace(SMALL, vhost_max_queues=queues_needed(Names("h"), ("shop",), SMALL))


@dataclass
class Scratch:
    broker: Broker

    @property
    def hub(self) -> str:
        return self.broker.hub

    @property
    def app(self) -> str:
        return self.broker.apps[0]

    def app_url(self) -> str:
        return self.broker.url(self.app)

    def admin_url(self) -> str:
        return self.broker.url("admin")


@pytest.fixture
async def scratch(hub: str) -> AsyncIterator[Scratch]:
    async with scratch_vhost(hub, apps=(f"{hub}-shop",), limits=LIMITS, topology=False) as b:
        yield Scratch(b)


def _limits(*args: str) -> dict[str, int]:
    """`rabbitmqctl -q list_vhost_limits -p V` / `list_user_limits --user U`: one JSON object."""
    listed = rabbitmqctl("-q", *args).stdout.strip().splitlines()
    return {str(k): int(v) for k, v in json.loads(listed[-1]).items()}


def _connections_of(user: str) -> int:
    listed = rabbitmqctl("-q", "list_connections", "user").stdout.split()
    return listed.count(user)


async def test_the_broker_holds_the_generated_limits(scratch: Scratch) -> None:
    assert _limits("list_vhost_limits", "-p", scratch.hub) == {
        "max-connections": 20,
        "max-queues": LIMITS.vhost_max_queues,
    }
    assert _limits("list_user_limits", "--user", scratch.app) == {
        "max-connections": 2,
        "max-channels": 3,
    }
    assert _limits("list_user_limits", "--user", f"{scratch.hub}-scheduler") == {
        "max-connections": 4,
        "max-channels": 8,
    }


async def test_a_user_past_its_connection_limit_is_refused(scratch: Scratch) -> None:
    held = []
    try:
        for _ in range(LIMITS.app_max_connections):
            held.append(await aio_pika.connect(scratch.app_url(), timeout=5))
        # The broker answers the third connection's open with a close (NOT_ALLOWED, "user
        # connection limit is reached"), which aiormq reports as an unexpected frame.
        with pytest.raises(aiormq.exceptions.AMQPError, match=r"Connection\.Close"):
            async with asyncio.timeout(10):
                await aiormq.connect(scratch.app_url())
        assert _connections_of(scratch.app) == LIMITS.app_max_connections
        # Another user is not held back by this one's limit.
        other = await aio_pika.connect(scratch.admin_url(), timeout=5)
        await other.close()
        # A connection given back makes room again: it was the limit, not the credentials.
        await held.pop().close()

        async def room_again() -> bool:
            try:
                async with asyncio.timeout(10):
                    held.append(await aio_pika.connect(scratch.app_url(), timeout=5))
            except aiormq.exceptions.AMQPError:
                return False
            return True

        await eventually(room_again, timeout=10, interval=0.2, what="a freed connection slot")
    finally:
        for connection in held:
            await connection.close()


async def test_a_user_past_its_channel_limit_is_refused(scratch: Scratch) -> None:
    connection = await aio_pika.connect(scratch.app_url(), timeout=5)
    try:
        for _ in range(LIMITS.app_max_channels):
            await connection.channel()
        limit = re.escape(f"user limit of ({LIMITS.app_max_channels})")
        with pytest.raises(aiormq.exceptions.ConnectionNotAllowed, match=limit):
            await connection.channel()
    finally:
        with contextlib.suppress(Exception):
            await connection.close()


async def test_the_vhost_past_its_queue_limit_refuses_a_declaration(scratch: Scratch) -> None:
    # As a scheduler, whose reply queues are the one kind of queue a process may make many of.
    connection = await aio_pika.connect(scratch.broker.url("scheduler"), timeout=5)
    names = Names(scratch.hub)
    try:
        channel = await connection.channel()
        for _ in range(LIMITS.vhost_max_queues):
            await channel.declare_queue(names.reply_queue("s"), exclusive=True)
        channel = await connection.channel()
        with pytest.raises(aiormq.exceptions.ChannelPreconditionFailed) as refused:
            await channel.declare_queue(names.reply_queue("s"), exclusive=True)
        assert "max_queues" in str(refused.value).lower() or "limit" in str(refused.value).lower()
    finally:
        await connection.close()
