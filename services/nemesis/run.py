"""One nemesis run: a whole topology on private servers, orders with transient errors, declines
and hangs at the remote service, the seed's schedule of faults, then the audit.

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

import aio_pika

from services.nemesis.fleet import Fleet, environment
from services.nemesis.process import free_port, listening
from services.nemesis.schedule import AGENT_PROCESSES, POISON_BODIES, Fault, Kind, draw
from services.nemesis.servers import PrivatePostgres, PrivateRabbitMQ
from services.operator.views import all_states
from services.remote.client import RemoteClient
from shared.broker.topology import Names
from shared.domain.states import SETTLED_STATES, ProcessState
from shared.domain.workflow import AGENTS
from shared.store.postgres import PostgresStore

log = logging.getLogger(__name__)

HUB = "nemesis"
"""The hub of a run; each further run on the same servers (`--runs`) gets one of its own."""
CLOCK_SKEW_S = 1.0
LIBFAKETIME = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1")

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
STOP_APP_TIMEOUT_S = 120.0


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
            }
        )
        self.fleet = Fleet(workdir, env, self.hub)
        self.order_ids: list[str] = []
        self.notes: list[str] = []
        self.unapplied: list[str] = []
        self._locks: dict[str, asyncio.Lock] = {}
        self._remote: RemoteClient | None = None

    def _lock(self, name: str) -> asyncio.Lock:
        return self._locks.setdefault(name, asyncio.Lock())

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
            span = max((f.at_s + f.duration_s for f in self.faults), default=0.0)
            begin = time.monotonic()
            strikes = [asyncio.create_task(self._strike(f, begin)) for f in self.faults]
            batches = [
                asyncio.create_task(self._submit_batch(i, begin, span)) for i in range(BATCHES)
            ]
            await asyncio.gather(*strikes, *batches)
            faults_over = time.monotonic()
            await self._heal()
            figures.settle_s = await self._settle(faults_over)
            await self._figures(figures)
        finally:
            await self._remote.close()
            codes = await asyncio.to_thread(self.fleet.stop_all)
            # -15: a process restarted a moment before, stopped before its handler was set.
            crashed = {k: v for k, v in codes.items() if v not in (0, -15)}
            if crashed:
                self.notes.append(f"exit codes at the end: {crashed}")
        figures.submitted = len(set(self.order_ids))
        figures.total_s = round(time.monotonic() - started, 1)
        figures.notes = self.notes
        figures.unapplied = self.unapplied
        return figures

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
        await _until(begin + span * index / BATCHES)
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

    async def _strike(self, fault: Fault, begin: float) -> None:
        await _until(begin + fault.at_s)
        try:
            await self._apply(fault)
        except Exception as exc:
            # A fault the harness could not apply fails the run: it proved less than it says.
            self.unapplied.append(f"{fault.describe()}: could not apply: {exc}")

    async def _apply(self, fault: Fault) -> None:
        d = fault.duration_s
        fleet = self.fleet
        if fault.kind is Kind.KILL:
            assert fault.target is not None
            async with self._lock(fault.target):
                await asyncio.to_thread(fleet.kill, fault.target)
                await asyncio.sleep(d)
                fleet.start(fault.target, fleet.args[fault.target])
        elif fault.kind is Kind.BROKER_RESTART:
            async with self._lock("rabbitmq"):
                # rabbitmqctl starts a VM of its own: on a loaded machine that takes a while.
                await asyncio.to_thread(self.mq.ctl, "stop_app", timeout=STOP_APP_TIMEOUT_S)
                await asyncio.sleep(d)
                await asyncio.to_thread(self.mq.start_app)
        elif fault.kind is Kind.STORE_RESTART:
            async with self._lock("postgres"):
                await asyncio.to_thread(self.pg.stop)
                await asyncio.sleep(d)
                await asyncio.to_thread(self.pg.start)
        elif fault.kind is Kind.REMOTE_OUTAGE:
            async with self._lock("remote"):
                await self._set_faults(outage=True)
                await asyncio.sleep(d)
                await self._set_faults(outage=False)
        elif fault.kind is Kind.REMOTE_HANGS:
            async with self._lock("remote"):
                await self._set_faults(hang_rate=fault.amount)
                await asyncio.sleep(d)
                await self._set_faults(hang_rate=float(REMOTE["ORDERFLOW_REMOTE_HANG_RATE"]))
        elif fault.kind is Kind.DUPLICATES:
            assert fault.target is not None
            await self._republish(int(fault.amount))
            async with self._lock(fault.target):
                await asyncio.to_thread(
                    fleet.restart,
                    fault.target,
                    {
                        "ORDERFLOW_FAULT_DUPLICATE_RATE": "0.5",
                        "ORDERFLOW_FAULT_SEED": str(self.seed),
                    },
                )
                await asyncio.sleep(d)
                await asyncio.to_thread(fleet.restart, fault.target)
        elif fault.kind is Kind.LATE_REPLIES:
            assert fault.target is not None
            async with self._lock(fault.target):
                await asyncio.to_thread(
                    fleet.restart,
                    fault.target,
                    {
                        "ORDERFLOW_FAULT_REPLY_DELAY_RATE": "0.5",
                        "ORDERFLOW_FAULT_REPLY_DELAY_MS": "3000",
                        "ORDERFLOW_FAULT_SEED": str(self.seed),
                    },
                )
                await asyncio.sleep(d)
                await asyncio.to_thread(fleet.restart, fault.target)
        elif fault.kind is Kind.POISON:
            await self._poison(int(fault.amount))
        elif fault.kind is Kind.CLOCK_JUMP:
            assert fault.target is not None
            async with self._lock(fault.target):
                await asyncio.to_thread(fleet.restart, fault.target, shifted(fault.amount))
                await asyncio.sleep(d)
                await asyncio.to_thread(fleet.restart, fault.target)

    async def _set_faults(self, **changes: Any) -> None:
        """Set the remote service's fault knobs; while it is down (killed by another fault) it
        is asked again until it answers."""
        assert self._remote is not None
        deadline = time.monotonic() + 60
        while True:
            try:
                await self._remote.set_faults(**changes)
                return
            except Exception:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.2)

    async def _republish(self, count: int) -> None:
        """Orders already submitted, published again with the same message ids."""
        if count:
            await asyncio.to_thread(
                self.fleet.cli,
                "submit",
                "--json",
                "--count",
                str(count),
                "--seed",
                str(self.seed * 1000),
            )

    async def _poison(self, count: int) -> None:
        """Messages no contract accepts: on the orders queue and on an agent's queue."""
        names = Names(self.hub)
        connection = await self._broker()
        try:
            channel = await connection.channel()
            submit = await channel.get_exchange(names.submit)
            direct = await channel.get_exchange(names.exchange)
            for i in range(count):
                body = POISON_BODIES[i % len(POISON_BODIES)]
                message = aio_pika.Message(
                    body,
                    message_id=f"poison-{self.seed}-{i}",
                    type="order.submit",
                    user_id="guest",
                )
                if i % 2:
                    await direct.publish(message, routing_key=names.agent(AGENTS[i % 3]))
                else:
                    await submit.publish(message, routing_key="")
        finally:
            await connection.close()

    async def _broker(self, timeout: float = 180) -> aio_pika.abc.AbstractConnection:
        """A connection to the private broker, once it takes one (another fault may have
        stopped it)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                return await aio_pika.connect(self.mq.url, timeout=5)
            except Exception:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.5)

    async def _heal(self) -> None:
        """After the last fault: every process running, with its own settings, and the remote
        service's knobs as at the start."""
        for label in self.fleet.dead():
            self.notes.append(f"{label} had exited; started again")
            self.fleet.start(label, self.fleet.args[label])
        await self._wait_remote()
        await self._set_faults(outage=False, hang_rate=float(REMOTE["ORDERFLOW_REMOTE_HANG_RATE"]))

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


async def _until(moment: float) -> None:
    delay = moment - time.monotonic()
    if delay > 0:
        await asyncio.sleep(delay)


def shifted(seconds: float) -> dict[str, str]:
    """Settings of a process whose wall clock is `seconds` off the machine's (libfaketime,
    Debian's `faketime`); its monotonic clock is left alone."""
    if not LIBFAKETIME.exists():
        raise RuntimeError(f"{LIBFAKETIME} is needed for a clock jump: apt-get install faketime")
    return {
        "LD_PRELOAD": str(LIBFAKETIME),
        "FAKETIME": f"{seconds:+.1f}s",
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
        "FAKETIME_NO_CACHE": "1",
    }


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
