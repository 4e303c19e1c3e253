"""The topology a benchmark measures: `orderflow up` in a task hub of the run's own (or the one
the settings name, with `--attach`), until every process reports; dropped afterwards."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import sys
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from harness.bench.procfs import children
from shared.bootstrap import open_broker
from shared.broker.topology import Names, delete_topology
from shared.config import Settings
from shared.domain.coordination import ComponentStatus
from shared.domain.timing import utcnow
from shared.domain.workflow import AGENTS
from shared.errors import BenchFailed
from shared.store.port import StateStore

REMOTE_KIND = "remote (stand-in)"
"""The remote service's line in the report: the stand-in for the outside service."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def private_settings(settings: Settings) -> Settings:
    """The settings with a task hub of the run's own and a free port for its remote service."""
    return settings.replace(
        hub=f"bench{uuid.uuid4().hex[:8]}", remote_url=f"http://127.0.0.1:{free_port()}"
    )


def processes(schedulers: int, agents: int) -> int:
    """How many processes report heartbeats: submission, the supervisor, the schedulers and
    `agents` per agent kind (the remote service reports none)."""
    return 2 + schedulers + agents * len(AGENTS)


def topology_env(settings: Settings, faults: dict[str, str], workdir: Path) -> dict[str, str]:
    """What `orderflow up` and its processes run with: the run's hub, servers and faults."""
    return {
        "ORDERFLOW_HUB": settings.hub,
        "ORDERFLOW_STORE_URL": settings.store.store_url,
        "ORDERFLOW_RABBITMQ_URL": settings.broker.rabbitmq_url,
        "ORDERFLOW_REMOTE_URL": settings.remote.remote_url,
        "ORDERFLOW_REMOTE_LEDGER_PATH": str(workdir / "ledger.sqlite3"),
        "ORDERFLOW_LOG_LEVEL": os.environ.get("ORDERFLOW_LOG_LEVEL", "WARNING"),
        **faults,
    }


@asynccontextmanager
async def topology(
    settings: Settings, *, schedulers: int, agents: int, env: dict[str, str], workdir: Path
) -> AsyncIterator[asyncio.subprocess.Process]:
    """`orderflow up --no-api` in the background, its output in `workdir/up.log`; stopped on
    exit."""
    log = (workdir / "up.log").open("wb")
    up = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "services.cli",
        "up",
        "--schedulers",
        str(schedulers),
        "--agents",
        str(agents),
        # The order pipeline alone: the HTTP API is no part of what a benchmark measures (and
        # its port is the deployment's).
        "--no-api",
        stdout=log,
        stderr=asyncio.subprocess.STDOUT,
        env=os.environ | env,
    )
    try:
        yield up
    finally:
        if up.returncode is None:
            up.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(up.wait(), timeout=settings.process.drain_timeout_s + 15)
            except TimeoutError:
                up.kill()
                await up.wait()
        log.close()


def last_words(workdir: Path) -> str:
    """The end of what the topology wrote, for an error."""
    return (workdir / "up.log").read_text(errors="replace")[-2000:]


def remote_processes(up: asyncio.subprocess.Process) -> dict[int, str]:
    """The remote service's process. It has no heartbeat; it is a stand-in for the outside
    world, but its CPU is this machine's too, so the report shows it on a line of its own."""
    return {
        pid: REMOTE_KIND for pid, cmdline in children(up.pid).items() if "serve remote" in cmdline
    }


async def wait_ready(
    store: StateStore, expected: int, up: asyncio.subprocess.Process | None, timeout: float
) -> list[ComponentStatus]:
    """Until `expected` processes report their heartbeats."""
    give_up = time.monotonic() + timeout
    while time.monotonic() < give_up:
        if up is not None and up.returncode is not None:
            raise BenchFailed(f"`orderflow up` exited with code {up.returncode}")
        statuses = await store.list_status(now=utcnow())
        if len(statuses) >= expected:
            return statuses
        await asyncio.sleep(0.25)
    raise BenchFailed(f"fewer than {expected} processes reported within {timeout:.0f}s")


async def cleanup(settings: Settings, store: StateStore, keep: bool) -> None:
    """Drop the run's hub, records and queues (unless `keep`); whatever fails is left."""
    if keep:
        return
    with contextlib.suppress(Exception):
        await store.drop()
    with contextlib.suppress(Exception):
        connection = await open_broker(settings, name="orderflow-bench-cleanup")
        try:
            await delete_topology(await connection.admin(), Names(settings.hub))
        finally:
            await connection.close()
