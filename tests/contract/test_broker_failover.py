"""A connection given a cluster's node list (shared/broker/rabbitmq/connection.py), on the real
it skips a node that does not answer, and when its connection is lost it goes on to the next
node, past one that is down. The broker's two "nodes" are the machine's one RabbitMQ under two
host names (127.0.0.1 and localhost); a third URL is a port nobody listens on. The real cluster,
with a node killed under load: tests/system/test_rabbitmq_cluster.py."""

from __future__ import annotations

import asyncio
import contextlib
import random
from urllib.parse import urlsplit, urlunsplit

import aio_pika
import pytest

from harness.nemesis.process import free_port
from shared.broker.port import Outgoing
from shared.broker.publisher import Publisher
from shared.broker.rabbitmq import RabbitConnection
from shared.broker.rabbitmq.connection import FailoverConnection, connect, connected_node
from shared.errors import PublishError, ServiceUnavailable
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


class CuttableProxy:
    """A TCP forwarder to the real broker, which can be cut: connections closed and the port
    refusing, as a node that died looks to its clients."""

    def __init__(self, upstream: str) -> None:
        parts = urlsplit(upstream)
        self._upstream = (parts.hostname or "127.0.0.1", parts.port or 5672)
        self._writers: list[asyncio.StreamWriter] = []
        self._server: asyncio.Server | None = None
        self.port = 0

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(*self._upstream)
        self._writers += [writer, up_writer]

        async def pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
            with contextlib.suppress(OSError):
                while data := await source.read(65536):
                    sink.write(data)
                    await sink.drain()
            sink.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    async def cut(self) -> None:
        assert self._server is not None
        self._server.close()
        for writer in self._writers:
            writer.close()
        await asyncio.wait_for(self._server.wait_closed(), timeout=5)


async def test_a_publish_while_no_node_answers_fails_within_its_timeout() -> None:
    """While its connection is being restored, a publish fails (at once, or within the
    publisher's timeout, which covers any wait for the channel too), never hangs: a process
    publishing while every node is away would otherwise wait there with nothing logged, and a
    step request held that way would be neither renewed nor reported."""
    proxy = CuttableProxy(RABBITMQ_URL)
    await proxy.start()
    via_proxy = _on_host(RABBITMQ_URL, f"127.0.0.1:{proxy.port}")
    try:
        connection = await connect(via_proxy, timeout=5, name="failover-test")
    except ServiceUnavailable as exc:
        service_missing("RabbitMQ", exc)
    try:
        publisher = await Publisher.open(RabbitConnection(connection), timeout=1.0)
        channel = await connection.channel()
        queue = await channel.declare_queue(exclusive=True)
        await publisher.publish_raw(Outgoing(b"before"), exchange="", routing_key=queue.name)
        await proxy.cut()

        async def reconnecting() -> bool:  # its reconnection attempts refused, one a second
            return not connection.connected.is_set() and connection.transport is None

        await eventually(reconnecting, timeout=10, what="the connection lost and not back")
        started = asyncio.get_running_loop().time()
        with pytest.raises(PublishError):
            # The guard only keeps a hanging publish from hanging the test.
            await asyncio.wait_for(
                publisher.publish_raw(Outgoing(b"after"), exchange="", routing_key=queue.name),
                timeout=15,
            )
        assert asyncio.get_running_loop().time() - started < 5
    finally:
        await connection.close()
