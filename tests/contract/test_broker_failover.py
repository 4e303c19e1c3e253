"""A connection given a cluster's node list (shared/broker/connection.py), on the real broker:
it skips a node that does not answer, and when its connection is lost it goes on to the next
node, past one that is down. The broker's two "nodes" are the machine's one RabbitMQ under two
host names (127.0.0.1 and localhost); a third URL is a port nobody listens on. The real cluster,
with a node killed under load: tests/system/test_rabbitmq_cluster.py."""

from __future__ import annotations

import random
from urllib.parse import urlsplit, urlunsplit

import aio_pika
import pytest

from services.nemesis.process import free_port
from shared.broker.connection import FailoverConnection, connect, connected_node
from shared.errors import ServiceUnavailable
from tests.conftest import RABBITMQ_URL, service_missing
from tests.support.waiting import eventually

pytestmark = pytest.mark.rabbitmq


def _on_host(url: str, netloc_host: str) -> str:
    parts = urlsplit(url)
    credentials = parts.netloc.rpartition("@")[0]
    return urlunsplit(parts._replace(netloc=f"{credentials}@{netloc_host}"))


@pytest.fixture
def nodes() -> tuple[str, str, str]:
    port = urlsplit(RABBITMQ_URL).port or 5672
    live_1 = _on_host(RABBITMQ_URL, f"127.0.0.1:{port}")
    live_2 = _on_host(RABBITMQ_URL, f"localhost:{port}")
    dead = _on_host(RABBITMQ_URL, f"127.0.0.1:{free_port()}")
    return live_1, dead, live_2


def _starting_at(index: int, size: int) -> random.Random:
    for seed in range(1000):
        if random.Random(seed).randrange(size) == index:
            return random.Random(seed)
    raise AssertionError("no seed")  # pragma: no cover


async def test_connect_skips_a_node_that_does_not_answer(nodes: tuple[str, str, str]) -> None:
    live_1, dead, live_2 = nodes
    try:
        connection = await connect(
            f"{dead},{live_2},{live_1}", timeout=5, name="failover-test", rng=_starting_at(0, 3)
        )
    except ServiceUnavailable as exc:
        service_missing("RabbitMQ", exc)
    try:
        assert isinstance(connection, FailoverConnection)
        assert urlsplit(connected_node(connection)).hostname == "localhost"
        assert "***" in connected_node(connection) or urlsplit(live_2).password is None
    finally:
        await connection.close()


async def test_no_node_answering_names_each_without_its_password() -> None:
    dead_1 = f"amqp://app:s3cret@127.0.0.1:{free_port()}/"
    dead_2 = f"amqp://app:s3cret@localhost:{free_port()}/"
    with pytest.raises(ServiceUnavailable, match="no RabbitMQ node is reachable") as caught:
        await connect(f"{dead_1},{dead_2}", timeout=2, name="failover-test")
    assert "s3cret" not in str(caught.value)
    assert str(caught.value).count("is unreachable") == 2


async def test_a_lost_connection_fails_over_past_a_dead_node(nodes: tuple[str, str, str]) -> None:
    live_1, dead, live_2 = nodes
    try:
        connection = await connect(
            f"{live_1},{dead},{live_2}", timeout=5, name="failover-test", rng=_starting_at(0, 3)
        )
    except ServiceUnavailable as exc:
        service_missing("RabbitMQ", exc)
    try:
        assert urlsplit(connected_node(connection)).hostname == "127.0.0.1"
        channel = await connection.channel()
        queue = await channel.declare_queue(exclusive=True)
        reconnected = 0

        def count(*_: object) -> None:
            nonlocal reconnected
            reconnected += 1

        connection.reconnect_callbacks.add(count)
        transport = connection.transport
        assert transport is not None
        await transport.connection.close(ConnectionError("node lost"))  # as if the node died

        async def on_the_third() -> bool:
            return reconnected > 0 and connection.connected.is_set()

        await eventually(on_the_third, timeout=20, what="a reconnection")
        assert urlsplit(connected_node(connection)).hostname == "localhost"
        # Channels and their queues were restored on the new node: it works as before.
        await channel.default_exchange.publish(aio_pika.Message(b"after"), queue.name)
        message = await eventually(lambda: queue.get(fail=False), timeout=5, what="a message")
        assert message is not None and message.body == b"after"
        await message.ack()
    finally:
        await connection.close()
