"""The `orderflow` command run as a real process against the real servers."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import tomllib
from collections.abc import AsyncIterator
from importlib import metadata
from pathlib import Path

import asyncpg
import pytest

from shared.broker.rabbitmq.connection import connect
from shared.broker.topology import Names
from tests.conftest import POSTGRES_URL, RABBITMQ_URL, RABBITMQ_USER, service_missing
from tests.support.topology import delete_hub

pytestmark = [pytest.mark.rabbitmq, pytest.mark.postgres]


def orderflow(*args: str, hub: str = "unused", **env: str) -> subprocess.CompletedProcess[str]:
    environment = (
        os.environ
        | {
            "ORDERFLOW_STORE_URL": POSTGRES_URL,
            "ORDERFLOW_RABBITMQ_URL": RABBITMQ_URL,
            "ORDERFLOW_HUB": hub,
            "ORDERFLOW_CONNECT_TIMEOUT_S": "3",
        }
        | env
    )
    return subprocess.run(
        [sys.executable, "-m", "services.cli", *args],
        capture_output=True,
        text=True,
        env=environment,
        timeout=60,
    )


@pytest.fixture
async def servers(hub: str) -> AsyncIterator[str]:
    try:
        pg = await asyncpg.connect(POSTGRES_URL, timeout=5)
    except Exception as exc:
        service_missing("PostgreSQL", exc)
    try:
        amqp = await connect(RABBITMQ_URL, timeout=5, name="cli-tests")
    except Exception as exc:
        await pg.close()
        service_missing("RabbitMQ", exc)
    try:
        yield hub
    finally:
        await pg.execute(f'DROP SCHEMA IF EXISTS "{hub}" CASCADE')
        await pg.close()
        await delete_hub(amqp, Names(hub))
        await amqp.close()


async def catalogue(hub: str) -> list[tuple[str, str]]:
    pg = await asyncpg.connect(POSTGRES_URL)
    try:
        rows = await pg.fetch(
            "SELECT tablename AS name, 'table' AS kind FROM pg_tables WHERE schemaname = $1 "
            "UNION ALL SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = $1 ORDER BY 1",
            hub,
        )
        return [(r["name"], r["kind"]) for r in rows]
    finally:
        await pg.close()


def test_version_and_help() -> None:
    version = orderflow("--version")
    assert version.returncode == 0
    # The installed package's version, which is pyproject's.
    project = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    assert version.stdout == f"orderflow, version {project['project']['version']}\n"
    assert metadata.version("orderflow") == project["project"]["version"]
    helped = orderflow("--help")
    assert helped.returncode == 0
    assert "init" in helped.stdout


async def test_init_twice_succeeds_and_changes_nothing_the_second_time(servers: str) -> None:
    hub = servers
    first = orderflow("init", hub=hub)
    assert first.returncode == 0, first.stderr
    assert "quorum queues ready" in first.stdout
    before = await catalogue(hub)
    assert {"orders", "state", "history", "compensation_log", "inbox", "lease", "alerts"} <= {
        name for name, kind in before if kind == "table"
    }

    # Data written between the runs must survive the second one.
    pg = await asyncpg.connect(POSTGRES_URL)
    await pg.execute(f'INSERT INTO "{hub}".lease VALUES ($1, $2, now(), now())', "marker", "me")
    amqp = await connect(RABBITMQ_URL, timeout=5, name="cli-tests")
    channel = await amqp.channel()
    import aio_pika

    await channel.default_exchange.publish(
        aio_pika.Message(b"{}", message_id="m", user_id=RABBITMQ_USER), f"{hub}.orders"
    )

    second = orderflow("init", hub=hub)
    assert second.returncode == 0, second.stderr
    assert await catalogue(hub) == before
    assert await pg.fetchval(f'SELECT holder FROM "{hub}".lease') == "me"
    queue = await channel.declare_queue(f"{hub}.orders", passive=True)
    assert queue.declaration_result.message_count == 1
    await pg.close()
    await amqp.close()


@pytest.mark.parametrize(
    ("env", "code", "says"),
    [
        ({"ORDERFLOW_STORE_URL": "postgresql://postgres@127.0.0.1:1/test"}, 3, "PostgreSQL at"),
        ({"ORDERFLOW_RABBITMQ_URL": "amqp://guest:guest@127.0.0.1:1/"}, 3, "RabbitMQ at"),
        ({"ORDERFLOW_STORE_URL": "mongodb://127.0.0.1:1"}, 3, "MongoDB at"),
        ({"ORDERFLOW_STORE_URL": "cassandra://x"}, 2, "ORDERFLOW_STORE_URL"),
        ({"ORDERFLOW_STORE_URL": "postgresql://h:notaport/x"}, 2, "not a number"),
        ({"ORDERFLOW_RABBITMQ_URL": "amqp://guest:secret@127.0.0.1:1/"}, 3, "amqp://***:***@"),
    ],
    ids=["pg-down", "rabbit-down", "mongo-down", "bad-scheme", "bad-port", "password-hidden"],
)
async def test_unreachable_servers_and_bad_urls_give_one_line_and_an_exit_code(
    servers: str, env: dict[str, str], code: int, says: str
) -> None:
    # With RabbitMQ unreachable, init has already made the hub's schema: `servers` removes it.
    result = orderflow("init", hub=servers, **env)
    assert result.returncode == code
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("orderflow: error: ")
    assert says in lines[0]
    assert "secret" not in result.stderr
    assert "Traceback" not in result.stderr


async def test_init_wait_retries_an_unreachable_server_for_a_bounded_time(servers: str) -> None:
    started = time.monotonic()
    result = orderflow(
        "init", "--wait", "2", hub=servers, ORDERFLOW_RABBITMQ_URL="amqp://127.0.0.1:1/"
    )
    took = time.monotonic() - started
    assert result.returncode == 3 and "RabbitMQ at" in result.stderr
    assert 1.0 <= took < 20, took  # retried (0.5 s, 1 s, ...), then gave up


@pytest.mark.parametrize("line", ["sku-1:2", "sku-1:two:1250", "sku-1:0:1250", "sku*1:2:1250"])
def test_a_malformed_line_flag_gives_one_line_and_publishes_nothing(line: str) -> None:
    # An unreachable broker: the flags are refused before any connection (else exit code 3).
    result = orderflow(
        "submit",
        "--line",
        line,
        hub="tneverused",
        ORDERFLOW_RABBITMQ_URL="amqp://guest:guest@127.0.0.1:1/",
    )
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"orderflow: error: configuration: --line {line!r}: ")
    assert "Traceback" not in result.stderr
    assert result.stdout == ""
