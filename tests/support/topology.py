"""Real orderflow processes for system and fault tests, each in a task hub of its own."""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from aio_pika.abc import AbstractRobustConnection

from shared.broker.rabbitmq import RabbitConnection
from shared.broker.rabbitmq.connection import connect
from shared.broker.topology import Names, delete_topology
from shared.domain.journal import HistoryEvent, HistoryEventType
from shared.domain.states import SETTLED_STATES, ProcessState
from shared.remote.client import RemoteClient
from shared.remote.fencing import fence_signature
from shared.store.postgres import PostgresStore
from tests.conftest import POSTGRES_URL, RABBITMQ_URL, service_missing
from tests.support.waiting import eventually

# Short timings so that recoveries happen in seconds, not minutes.
FAST = {
    "ORDERFLOW_STEP_TIMEOUT_S": "2",
    "ORDERFLOW_SUPERVISOR_INTERVAL_S": "0.3",
    "ORDERFLOW_LEASE_TTL_S": "2",
    "ORDERFLOW_BACKOFF_BASE_S": "0.1",
    "ORDERFLOW_BACKOFF_CAP_S": "1",
    "ORDERFLOW_COOLDOWN_S": "2",
    "ORDERFLOW_POLL_INTERVAL_S": "0.05",
    "ORDERFLOW_DRAIN_TIMEOUT_S": "3",
    "ORDERFLOW_BREAKER_RESET_S": "1",
    "ORDERFLOW_CONNECT_TIMEOUT_S": "5",
    "ORDERFLOW_INBOX_CLAIM_TTL_S": "5",
    "ORDERFLOW_HANDLER_TIMEOUT_S": "4",
    "ORDERFLOW_LOG_LEVEL": "INFO",
}


REMOTE_ADMIN_TOKEN = secrets.token_hex(16)
"""The remote service's operator token (its /admin and /ledger need it; `audit` sends it): one per
test run, so that a topology using another's remote service (test_hubs) holds the right one."""


# Below Linux's ephemeral range (32768-60999 by default), where no outgoing connection of any
# process takes a port between the choice and the listener's bind; a port once handed out is not
# handed out again by this process.
_LISTEN_PORTS = range(20_000, 32_768)
_handed_out: set[int] = set()


def free_port() -> int:
    """A port no one listens on, for a process the test starts to listen on."""
    while True:
        port = secrets.choice(_LISTEN_PORTS)
        if port in _handed_out:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _handed_out.add(port)
        return port


class Topology:
    def __init__(
        self,
        hub: str,
        workdir: Path,
        env: dict[str, str],
        *,
        store_url: str = POSTGRES_URL,
        rabbitmq_url: str = RABBITMQ_URL,
    ) -> None:
        self.hub = hub
        self.workdir = workdir
        self.store_url = store_url
        self.rabbitmq_url = rabbitmq_url
        self.remote_url = f"http://127.0.0.1:{free_port()}"
        # The hub's account at its remote service: the agents' key, and the schedulers' fence
        # key (harness/remote/accounts.py); the remote holds both.
        self.account_key = secrets.token_hex(16)
        self.fence_key = secrets.token_hex(16)
        self.env = (
            os.environ
            | FAST
            | {
                "ORDERFLOW_HUB": hub,
                "ORDERFLOW_STORE_URL": store_url,
                "ORDERFLOW_RABBITMQ_URL": rabbitmq_url,
                "ORDERFLOW_REMOTE_URL": self.remote_url,
                "ORDERFLOW_REMOTE_LEDGER_PATH": str(workdir / "ledger.sqlite3"),
                "ORDERFLOW_REMOTE_SEED": "7",
                "ORDERFLOW_REMOTE_ADMIN_TOKEN": REMOTE_ADMIN_TOKEN,
                "ORDERFLOW_REMOTE_ACCOUNT_KEY": self.account_key,
                "ORDERFLOW_REMOTE_FENCE_KEY": self.fence_key,
                "ORDERFLOW_REMOTE_ACCOUNTS": self.account_entry,
            }
            | env
        )
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.store: PostgresStore
        self.remote: RemoteClient

    @property
    def account_entry(self) -> str:
        """The hub's entry in a remote service's `ORDERFLOW_REMOTE_ACCOUNTS`."""
        return f"{self.hub}:{self.account_key}:{self.fence_key}"

    def sign(self, fencing_token: str) -> str:
        """The signature the hub's schedulers give `fencing_token` (for a test that calls the
        remote service as one of the hub's attempts would)."""
        return fence_signature(self.fence_key.encode(), self.hub, fencing_token)

    # -- processes
    def start(self, label: str, *args: str, **env: str) -> subprocess.Popen[bytes]:
        running = self.procs.get(label)
        if running is not None and running.poll() is None:
            raise RuntimeError(f"{label} is already running")
        log = (self.workdir / f"{label}.log").open("ab")
        proc = subprocess.Popen(
            [sys.executable, "-m", "services.cli", *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=self.env | env,
        )
        self.procs[label] = proc
        return proc

    def serve(self, label: str, *args: str, **env: str) -> subprocess.Popen[bytes]:
        return self.start(label, "serve", *args, "--name", f"{self.hub}-{label}", **env)

    async def start_all(
        self, *, schedulers: int = 1, supervisors: int = 1, **remote_env: str
    ) -> None:
        """Start every process not running yet."""
        wanted = [("remote", ["remote"]), ("submission", ["submission"])]
        wanted += [(f"scheduler-{i}", ["scheduler"]) for i in range(1, schedulers + 1)]
        wanted += [(f"supervisor-{i}", ["supervisor"]) for i in range(1, supervisors + 1)]
        wanted += [(agent, ["agent", agent]) for agent in ("inventory", "payment", "shipping")]
        for label, args in wanted:
            proc = self.procs.get(label)
            if proc is None or proc.poll() is not None:
                self.serve(label, *args, **(remote_env if label == "remote" else {}))
        await self.wait_remote()

    async def wait_remote(self) -> None:
        async def healthy() -> bool:
            try:
                await self.remote.faults()
            except Exception:
                return False
            return True

        # A loaded machine gives a starting process little CPU: a remote may take half a minute.
        await eventually(healthy, timeout=60, what="the remote service answering")

    def signal(self, label: str, sig: int) -> None:
        self.procs[label].send_signal(sig)

    def kill(self, label: str) -> None:
        self.signal(label, signal.SIGKILL)
        self.procs[label].wait(timeout=10)

    def stop_all(self) -> dict[str, int | None]:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        codes: dict[str, int | None] = {}
        for label, proc in self.procs.items():
            try:
                codes[label] = proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                codes[label] = None
        return codes

    def cli(self, *args: str, timeout: float = 120, **env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "services.cli", *args],
            capture_output=True,
            text=True,
            env=self.env | env,
            timeout=timeout,
        )

    def logs(self, label: str) -> str:
        path = self.workdir / f"{label}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    async def connect_store(self) -> None:
        """Open the test's own pool on the topology's store (again, after its server restarted:
        the old pool's connections died with it)."""
        self.store = await PostgresStore.connect(
            self.store_url, self.hub, pool_size=5, timeout=5, command_timeout=10
        )

    # -- observations
    async def counts(self) -> dict[ProcessState, int]:
        return await self.store.count_by_state()

    async def wait_settled(self, n: int, *, timeout: float = 120) -> dict[ProcessState, int]:
        async def settled() -> dict[ProcessState, int] | None:
            counts = await self.counts()
            done = sum(counts[s] for s in SETTLED_STATES)
            return counts if done >= n else None

        return await eventually(settled, timeout=timeout, interval=0.2, what=f"{n} settled orders")

    async def wait_count(self, state: ProcessState, n: int, *, timeout: float = 90) -> None:
        """Until exactly `n` orders of the hub are in `state`."""

        async def reached() -> bool:
            return (await self.counts())[state] == n

        await eventually(reached, timeout=timeout, interval=0.2, what=f"{n} orders {state}")

    async def history(
        self, order_id: str, kind: HistoryEventType | None = None
    ) -> list[HistoryEvent]:
        events = await self.store.read_history(order_id)
        return [e for e in events if kind is None or e.type is kind]

    async def audit(self) -> dict[str, Any]:
        result = self.cli("audit", "--json", "--grace", "30")
        assert result.returncode in (0, 1), result.stderr
        return dict(json.loads(result.stdout))


@asynccontextmanager
async def running_topology(
    hub: str,
    workdir: Path,
    *,
    store_url: str = POSTGRES_URL,
    rabbitmq_url: str = RABBITMQ_URL,
    **env: str,
) -> AsyncIterator[Topology]:
    """Processes of `hub` on the given store and broker (by default the machine's test servers;
    the fault suite passes its private ones), and the hub removed from both afterwards."""
    try:
        probe = await PostgresStore.connect(
            store_url, hub, pool_size=2, timeout=5, command_timeout=10
        )
        await probe.close()
        probe_amqp = await connect(rabbitmq_url, timeout=5, name="system-tests")
        await probe_amqp.close()
    except Exception as exc:
        service_missing("PostgreSQL and RabbitMQ", exc)
    topo = Topology(hub, workdir, env, store_url=store_url, rabbitmq_url=rabbitmq_url)
    init = topo.cli("init")
    assert init.returncode == 0, init.stderr
    await topo.connect_store()
    # Forged calls and replays in tests act as the hub, as its agents do.
    topo.remote = RemoteClient.open(
        topo.remote_url,
        account=hub,
        account_key=topo.account_key,
        admin_token=topo.env["ORDERFLOW_REMOTE_ADMIN_TOKEN"],
    )
    try:
        yield topo
    finally:
        codes = topo.stop_all()
        for label in topo.procs:
            tail = "\n".join(topo.logs(label).splitlines()[-15:])
            print(f"--- {label} (exit {codes.get(label)}) ---\n{tail}")
        await topo.remote.close()
        await topo.store.drop()
        await topo.store.close()
        # A fresh connection: a fault test may just have restarted RabbitMQ, and a
        # connection held since the start would still be waiting to reconnect.
        amqp = await connect(topo.rabbitmq_url, timeout=10, name="system-tests")
        try:
            await delete_hub(amqp, Names(hub))
        finally:
            await amqp.close()


async def delete_hub(raw: AbstractRobustConnection, names: Names) -> None:
    """Delete the hub's queues and exchanges over a raw robust connection the caller holds
    (and closes): the port's admin on it, as `delete_topology` takes."""
    admin = await RabbitConnection(raw).admin()
    try:
        await delete_topology(admin, names)
    finally:
        await admin.close()


async def all_orders(topo: Topology) -> list[Any]:
    states = []
    after = None
    while batch := await topo.store.list_states(after=after, limit=1000):
        states += batch
        after = batch[-1].order_id
    return states
