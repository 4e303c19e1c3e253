"""The private servers the fault suite restarts (harness/nemesis/servers.py): they keep their data
and port across a restart and a crash, `stop_app` drops connections, and nothing of them outlives
their `with`, nor a test run killed in the middle.

Each test starts servers of its own (not the suite's shared ones), since what it checks is their
whole life.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import aio_pika
import asyncpg
import pytest

from harness.nemesis.servers import PrivatePostgres, PrivateRabbitMQ
from shared.errors import ServerMissing
from tests.conftest import service_missing
from tests.support.waiting import eventually

pytestmark = [pytest.mark.rabbitmq, pytest.mark.postgres, pytest.mark.faults]

ROOT = Path(__file__).resolve().parents[2]
S = TypeVar("S", PrivatePostgres, PrivateRabbitMQ)


def _server(make: Callable[[], S]) -> S:
    try:
        return make()
    except ServerMissing as exc:
        service_missing("a private server", exc)
        raise


def _alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie, dead but not yet reaped by init, does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True
    return stat.rpartition(")")[2].split()[0] != "Z"


def _exists(path: str) -> bool:
    return Path(path).exists()


def _beam_pid(server: PrivateRabbitMQ) -> int:
    return int((server.base / "rabbitmq.pid").read_text().split()[0])


async def _count(url: str) -> int:
    connection = await asyncpg.connect(url, timeout=10)
    try:
        return int(await connection.fetchval("SELECT count(*) FROM kept"))
    finally:
        await connection.close()


async def test_postgres_keeps_its_data_and_port_through_a_restart_and_a_crash() -> None:
    server = _server(lambda: PrivatePostgres(database="nemesis"))
    with server as pg:
        assert pg.url == f"postgresql://postgres@127.0.0.1:{pg.port}/nemesis"
        connection = await asyncpg.connect(pg.url, timeout=10)
        await connection.execute("CREATE TABLE kept (n int); INSERT INTO kept VALUES (1), (2)")
        await connection.close()

        first = pg.pid
        assert first is not None
        await asyncio.to_thread(pg.restart)
        assert pg.pid != first and not _alive(first)
        assert await _count(pg.url) == 2

        await asyncio.to_thread(pg.kill)
        assert not pg.running
        await asyncio.to_thread(pg.start)  # crash recovery, on the same port
        assert await _count(pg.url) == 2
        pid, base = pg.pid, pg.base
    assert pid is not None and not _alive(pid)
    assert not base.exists()


async def test_rabbitmq_drops_connections_on_stop_app_and_keeps_durable_queues() -> None:
    server = _server(PrivateRabbitMQ)
    with server as mq:
        assert mq.url == f"amqp://guest:guest@127.0.0.1:{mq.port}/"
        connection = await aio_pika.connect(mq.url, timeout=10)
        channel = await connection.channel()
        queue = await channel.declare_queue("kept", durable=True)
        message = aio_pika.Message(b"{}", delivery_mode=aio_pika.DeliveryMode.PERSISTENT)
        await channel.default_exchange.publish(message, routing_key="kept")

        node_pid = _beam_pid(mq)
        await asyncio.to_thread(mq.stop_app)

        async def dropped() -> bool:
            return not connection.connected.is_set()  # cleared when the server closes it

        await eventually(dropped, timeout=15, what="the connection dropped by stop_app")
        assert _alive(node_pid), "stop_app leaves the node running"
        await asyncio.to_thread(mq.start_app)

        await asyncio.to_thread(mq.restart)
        assert not _alive(node_pid)
        listed = mq.ctl("list_queues", "-q", "name", "messages", "--formatter", "json").stdout
        assert {"name": "kept", "messages": 1} in json.loads(listed)
        again = await aio_pika.connect(mq.url, timeout=10)
        queue = await (await again.channel()).declare_queue("kept", passive=True)
        assert queue.declaration_result.message_count == 1
        await again.close()
        await connection.close()
        pid, base, node_pid = mq.pid, mq.base, _beam_pid(mq)
    assert pid is not None and not _alive(pid) and not _alive(node_pid)
    assert not base.exists()


OWNER = """
import json, sys, time
from harness.nemesis.servers import PrivatePostgres, PrivateRabbitMQ
with PrivatePostgres() as pg, PrivateRabbitMQ() as mq:
    beam = int((mq.base / "rabbitmq.pid").read_text())
    print(json.dumps({"pids": [pg.pid, mq.pid, beam], "dirs": [str(pg.base), str(mq.base)]}))
    sys.stdout.flush()
    time.sleep(600)
"""


async def test_servers_die_with_an_owner_killed_mid_run() -> None:
    """A test run SIGKILLed (no `finally`, no fixture teardown) leaves no server behind: the
    watchdog kills them by their pid files and removes their directories."""
    # Both installed, or skip (fail under ORDERFLOW_REQUIRE_SERVICES) here.
    _server(PrivatePostgres)
    _server(PrivateRabbitMQ)
    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    try:
        assert owner.stdout is not None
        line = await asyncio.wait_for(asyncio.to_thread(owner.stdout.readline), timeout=180)
        started = json.loads(line)
        assert all(_alive(pid) for pid in started["pids"])
    finally:
        owner.send_signal(signal.SIGKILL)
        owner.wait(timeout=10)

    async def gone() -> bool:
        return not any(map(_alive, started["pids"])) and not any(map(_exists, started["dirs"]))

    await eventually(gone, timeout=30, what="the servers killed and their directories removed")
