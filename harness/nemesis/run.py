"""One nemesis run: a whole topology on private servers, orders with transient errors, declines
and hangs at the remote service, the seed's schedule of faults (struck by strikes.py), then the
audit and the run's figures.

Nothing here touches the machine's own servers: PostgreSQL and RabbitMQ are private instances in
a temporary directory (servers.py), stopped and removed at the end whatever happens.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.nemesis.fleet import Fleet, environment
from harness.nemesis.process import free_port, listening
from harness.nemesis.schedule import AGENT_PROCESSES, Fault, draw
from harness.nemesis.servers import PrivatePostgres, PrivateRabbitMQ
from harness.nemesis.strikes import Striker, until
from services.operator.views import all_states
from shared.domain.states import SETTLED_STATES, ProcessState
from shared.domain.workflow import AGENTS
from shared.remote.client import RemoteClient
from shared.store.postgres import PostgresStore

log = logging.getLogger(__name__)

HUB = "nemesis"
"""The hub of a run; each further run on the same servers (`--runs`) gets one of its own."""
CLOCK_SKEW_S = 1.0

TIMINGS = {
    # Short, so that recoveries happen in seconds: what the tests' topology uses.
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
    "ORDERFLOW_OUTAGE_PATIENCE_S": "4",
    "ORDERFLOW_RETRY_DELAY_S": "1",
    "ORDERFLOW_CLOCK_SKEW_S": str(CLOCK_SKEW_S),
    "ORDERFLOW_HEARTBEAT_S": "1",
    "ORDERFLOW_LOG_LEVEL": "INFO",
}
REMOTE = {
    # The unreliable remote service of every run: transient errors, declines and hangs.
    "ORDERFLOW_REMOTE_TRANSIENT_ERROR_RATE": "0.1",
    "ORDERFLOW_REMOTE_DECLINE_RATE": "0.05",
    "ORDERFLOW_REMOTE_HANG_RATE": "0.02",
    "ORDERFLOW_REMOTE_HANG_S": "3",
}
CALM_HANG_RATE = float(REMOTE["ORDERFLOW_REMOTE_HANG_RATE"])
"""The share of remote calls that hang outside a `remote-hangs` fault."""
TOPOLOGY: tuple[tuple[str, list[str]], ...] = (
    ("remote", ["remote"]),
    ("submission", ["submission"]),
    ("scheduler-1", ["scheduler"]),
    ("scheduler-2", ["scheduler"]),
    ("supervisor-1", ["supervisor"]),
    ("supervisor-2", ["supervisor"]),
    *((f"{agent}-1", ["agent", agent]) for agent in AGENTS),
)
BATCHES = 4
"""The orders go out in this many batches across the faults."""


@dataclass
class Figures:
    seed: int
    faults: int
    orders: int
    schedule: list[dict[str, Any]]
    submitted: int = 0
    lost: int = 0
    duplicate_effects: int = 0
    budget_overspends: int = 0
    audit_violations: int = 0
    violations: list[str] = field(default_factory=list)
    outcome: dict[str, int] = field(default_factory=dict)
    settle_s: float | None = None
    """From the end of the last fault until every order was terminal (None: not within the
    deadline)."""
    total_s: float = 0.0
    notes: list[str] = field(default_factory=list)
    unapplied: list[str] = field(default_factory=list)
    """Faults of the schedule the harness could not strike (the run then fails)."""
    workdir: str | None = None

    @property
    def ok(self) -> bool:
        return (
            self.lost == 0
            and self.duplicate_effects == 0
            and self.budget_overspends == 0
            and self.audit_violations == 0
            and self.settle_s is not None
            and not self.unapplied
        )

    def as_dict(self) -> dict[str, Any]:
        data = dict(self.__dict__)
        data["ok"] = self.ok
        return data


class Nemesis:
    def __init__(
        self,
        seed: int,
        faults: list[Fault],
        orders: int,
        pg: PrivatePostgres,
        mq: PrivateRabbitMQ,
        workdir: Path,
        hub: str = HUB,
    ) -> None:
        self.seed = seed
        self.faults = faults
        self.orders = orders
        self.pg = pg
        self.mq = mq
        self.workdir = workdir
        self.token = secrets.token_hex(16)
        self.hub = hub
        # The hub's account at the remote service: the agents' key, the schedulers' fence key.
        account_key, fence_key = secrets.token_hex(16), secrets.token_hex(16)
        self.remote_url = f"http://127.0.0.1:{free_port()}"
        env = (
            environment()
            | TIMINGS
            | REMOTE
            | {
                "ORDERFLOW_HUB": self.hub,
                "ORDERFLOW_STORE_URL": pg.url,
                "ORDERFLOW_RABBITMQ_URL": mq.url,
                "ORDERFLOW_REMOTE_URL": self.remote_url,
                "ORDERFLOW_REMOTE_LEDGER_PATH": str(workdir / "ledger.sqlite3"),
                "ORDERFLOW_REMOTE_SEED": str(seed),
                "ORDERFLOW_REMOTE_ADMIN_TOKEN": self.token,
                "ORDERFLOW_REMOTE_ACCOUNT_KEY": account_key,
                "ORDERFLOW_REMOTE_FENCE_KEY": fence_key,
                "ORDERFLOW_REMOTE_ACCOUNTS": f"{self.hub}:{account_key}:{fence_key}",
            }
        )
        self.fleet = Fleet(workdir, env, self.hub)
        self.order_ids: list[str] = []
        self.notes: list[str] = []
        self._remote: RemoteClient | None = None

    # -- the run
    async def run(self) -> Figures:
        figures = Figures(
            seed=self.seed,
            faults=len(self.faults),
            orders=self.orders,
            schedule=[f.as_dict() | {"text": f.describe()} for f in self.faults],
            workdir=str(self.workdir),
        )
        started = time.monotonic()
        init = await asyncio.to_thread(self.fleet.cli, "init")
        if init.returncode != 0:
            raise RuntimeError(f"orderflow init failed: {init.stderr.strip()[-500:]}")
        for label, args in TOPOLOGY:
            self.fleet.start(label, args)
        self._remote = RemoteClient.open(self.remote_url, account=self.hub, admin_token=self.token)
        try:
            await self._wait_remote()
            striker = Striker(
                seed=self.seed,
                hub=self.hub,
                fleet=self.fleet,
                pg=self.pg,
                mq=self.mq,
                remote=self._remote,
                calm_hang_rate=CALM_HANG_RATE,
            )
            faults_over = await self._strike_and_submit(striker)
            figures.unapplied = striker.unapplied
            await self._heal(striker)
            figures.settle_s = await self._settle(faults_over)
            await self._figures(figures)
        finally:
            await self._remote.close()
            await self._stop_all()
        figures.submitted = len(set(self.order_ids))
        figures.total_s = round(time.monotonic() - started, 1)
        figures.notes = self.notes
        return figures

    async def _strike_and_submit(self, striker: Striker) -> float:
        """The schedule's faults, and the orders in batches across them; when the last fault
        was lifted (`time.monotonic()`)."""
        span = max((f.at_s + f.duration_s for f in self.faults), default=0.0)
        begin = time.monotonic()
        strikes = [asyncio.create_task(striker.strike(f, begin)) for f in self.faults]
        batches = [asyncio.create_task(self._submit_batch(i, begin, span)) for i in range(BATCHES)]
        await asyncio.gather(*strikes, *batches)
        return time.monotonic()

    async def _stop_all(self) -> None:
        codes = await asyncio.to_thread(self.fleet.stop_all)
        # -15: a process restarted a moment before, stopped before its handler was set.
        crashed = {k: v for k, v in codes.items() if v not in (0, -15)}
        if crashed:
            self.notes.append(f"exit codes at the end: {crashed}")

    async def _wait_remote(self, timeout: float = 30) -> None:
        assert self._remote is not None
        deadline = time.monotonic() + timeout
        while True:
            try:
                await self._remote.faults()
                return
            except Exception:
                if time.monotonic() > deadline:
                    raise RuntimeError("the remote service did not answer") from None
                await asyncio.sleep(0.1)

    async def _submit_batch(self, index: int, begin: float, span: float) -> None:
        """One batch of orders at its share of the span; a batch the broker refuses (an outage)
        is published again, same seed, same orders and message ids, until it is taken."""
        await until(begin + span * index / BATCHES)
        count = self.orders // BATCHES + (1 if index < self.orders % BATCHES else 0)
        if count == 0:
            return
        seed = self.seed * 1000 + index
        deadline = time.monotonic() + 180
        while True:
            result = await asyncio.to_thread(
                self.fleet.cli, "submit", "--json", "--count", str(count), "--seed", str(seed)
            )
            if result.returncode == 0:
                self.order_ids += json.loads(result.stdout)["order_ids"]
                return
            if time.monotonic() > deadline:
                self.notes.append(f"batch {index} never accepted: {result.stderr.strip()[-300:]}")
                return
            await asyncio.sleep(1)

    async def _heal(self, striker: Striker) -> None:
        """After the last fault: every process running, with its own settings, and the remote
        service's knobs as at the start."""
        for label in self.fleet.dead():
            self.notes.append(f"{label} had exited; started again")
            self.fleet.start(label, self.fleet.args[label])
        await self._wait_remote()
        await striker.set_faults(outage=False, hang_rate=CALM_HANG_RATE)

    async def _settle(self, since: float, timeout: float = 240) -> float | None:
        """Seconds until every submitted order is terminal, None past the timeout."""
        ids = set(self.order_ids)
        deadline = time.monotonic() + timeout
        store = await PostgresStore.connect(
            self.pg.url, self.hub, pool_size=2, timeout=5, command_timeout=30
        )
        try:
            while time.monotonic() < deadline:
                states = await _states(store)
                if all(i in states and states[i] in SETTLED_STATES for i in ids):
                    return round(time.monotonic() - since, 1)
                await asyncio.sleep(0.5)
        finally:
            await store.close()
        return None

    async def _figures(self, figures: Figures) -> None:
        assert self._remote is not None
        store = await PostgresStore.connect(
            self.pg.url, self.hub, pool_size=2, timeout=5, command_timeout=30
        )
        try:
            states = await _states(store)
        finally:
            await store.close()
        ids = set(self.order_ids)
        figures.lost = sum(1 for i in ids if states.get(i) not in SETTLED_STATES)
        figures.outcome = dict(sorted(Counter(states[i].value for i in ids if i in states).items()))
        effects = await self._remote.ledger()
        made = Counter(
            (e["order_id"], e["operation"]) for e in effects if e["outcome"] == "applied"
        )
        figures.duplicate_effects = sum(n - 1 for n in made.values() if n > 1)
        result = await asyncio.to_thread(self.fleet.cli, "audit", "--json", "--grace", "30")
        if result.returncode not in (0, 1):
            figures.audit_violations += 1
            figures.violations.append(f"audit failed: {result.stderr.strip()[-300:]}")
            return
        report = json.loads(result.stdout)
        violations = report.get("violations", [])
        figures.audit_violations = len(violations)
        figures.violations += [json.dumps(v)[:300] for v in violations[:20]]
        figures.budget_overspends = sum(1 for v in violations if _overspend(v))


def _overspend(violation: Any) -> bool:
    text = json.dumps(violation).lower()
    return "budget" in text and "attempt" in text


async def _states(store: PostgresStore) -> dict[str, ProcessState]:
    """Every order's state, by order id (the audit's paged read)."""
    return {s.order_id: s.process_state for s in await all_states(store)}


def span_for(faults: int) -> float:
    """Seconds the faults are spread over: room for each to strike on its own."""
    return max(15.0, 2.5 * faults)


async def run_nemesis(seed: int, faults: int, orders: int, *, keep: Path | None = None) -> Figures:
    """Start private servers, run the seed's schedule against a fresh topology, audit."""
    async for figures in run_seeds(seed, 1, faults, orders, keep=keep):
        return figures
    raise AssertionError("one run yields one figures")  # pragma: no cover


async def run_seeds(
    first: int, runs: int, faults: int, orders: int, *, keep: Path | None = None
) -> AsyncIterator[Figures]:
    """Seeds `first` … `first + runs - 1`, one after the other on one pair of private servers
    (a RabbitMQ node takes its seconds to boot), each run in a hub and a topology of its own."""
    with PrivatePostgres() as pg, PrivateRabbitMQ() as mq:
        for seed in range(first, first + runs):
            # A fault that could not restart a server leaves it down: each run starts on both up.
            if not pg.running:
                await asyncio.to_thread(pg.start)
            if not listening(mq.port):
                await asyncio.to_thread(mq.start_app)
            schedule = draw(seed, faults, span_s=span_for(faults), clock_skew_s=CLOCK_SKEW_S)
            if keep is not None:
                workdir = keep / str(seed)
            else:
                workdir = Path(tempfile.mkdtemp(prefix=f"orderflow-nemesis-{seed}-"))
            workdir.mkdir(parents=True, exist_ok=True)
            hub = HUB if runs == 1 else f"{HUB}{seed % 10**12}"
            figures = await Nemesis(seed, schedule, orders, pg, mq, workdir, hub).run()
            if figures.ok and keep is None:
                # A passing run's logs are of no use; a failing one's are kept to read.
                shutil.rmtree(workdir, ignore_errors=True)
                figures.workdir = None
            yield figures


__all__ = ["AGENT_PROCESSES", "Figures", "run_nemesis", "run_seeds", "span_for"]
