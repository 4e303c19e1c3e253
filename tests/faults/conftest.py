"""The fault-injection suite: real processes, real servers, one fault per test.

Every test ends in `FaultRun.settle`, which waits until every order it submitted is terminal, then
checks the invariants of DESIGN §8 (`orderflow audit`, plus lost orders and duplicate effects
counted here) and records a row of the table printed at the end of the run (and written to
`$ORDERFLOW_FAULT_REPORT` when set).

A test that stops, crashes or restarts a server runs its topology on `private_topo`: a PostgreSQL
cluster and a RabbitMQ node of the suite's own (harness/nemesis/servers.py), never the machine's,
which other work on the machine uses.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from harness.nemesis.process import listening
from harness.nemesis.servers import PrivatePostgres, PrivateRabbitMQ
from shared.domain.journal import Alert, AlertKind
from shared.domain.models import StateRecord
from shared.domain.states import SETTLED_STATES, ProcessState
from shared.errors import ServerMissing
from tests.conftest import service_missing
from tests.support.topology import Topology, all_orders, running_topology
from tests.support.waiting import eventually


@dataclass
class FaultRow:
    fault: str
    orders: int
    lost: int
    duplicate_effects: int
    seconds: float
    outcome: str


ROWS: list[FaultRow] = []


class FaultRun:
    """One fault test's orders, the moment its fault struck, and the checks at the end."""

    def __init__(self, topo: Topology, fault: str) -> None:
        self.topo = topo
        self.fault = fault
        self.order_ids: list[str] = []
        self.fault_at: float | None = None

    def submit(self, count: int, *, seed: int, **env: str) -> list[str]:
        result = self.topo.cli(
            "submit", "--json", "--count", str(count), "--seed", str(seed), **env
        )
        assert result.returncode == 0, result.stderr
        published = json.loads(result.stdout)
        assert published["published"] == count
        ids = list(published["order_ids"])
        self.order_ids += ids
        return ids

    def struck(self) -> None:
        """The fault happens now."""
        self.fault_at = time.monotonic()

    async def settled_count(self) -> int:
        counts = await self.topo.counts()
        return sum(counts[s] for s in SETTLED_STATES)

    async def wait_for(self, state: ProcessState, at_least: int, *, timeout: float = 60) -> None:
        async def enough() -> bool:
            return (await self.topo.counts())[state] >= at_least

        await eventually(enough, timeout=timeout, interval=0.05, what=f"{at_least} {state}")

    async def settle(
        self, *, timeout: float = 120, all_in: ProcessState | None = None
    ) -> list[StateRecord]:
        """Wait for every submitted order to be terminal (or, with `all_in`, in that state);
        check DESIGN §8; record the row."""
        assert self.fault_at is not None, "the test never struck its fault"
        assert self.order_ids, "the test submitted no orders"
        wanted = set(SETTLED_STATES) if all_in is None else {all_in}
        ids = set(self.order_ids)

        async def arrived() -> bool:
            states = [s for s in await all_orders(self.topo) if s.order_id in ids]
            return len(states) == len(ids) and all(s.process_state in wanted for s in states)

        what = f"all {len(ids)} orders {'terminal' if all_in is None else all_in}"
        await eventually(arrived, timeout=timeout, interval=0.2, what=what)
        seconds = time.monotonic() - self.fault_at
        states = {s.order_id: s for s in await all_orders(self.topo)}
        mine = [states[i] for i in self.order_ids if i in states]
        lost = sum(
            1
            for order_id in self.order_ids
            if order_id not in states or states[order_id].process_state not in SETTLED_STATES
        )
        effects = await self.topo.remote.ledger()
        made = Counter(
            (e["order_id"], e["operation"]) for e in effects if e["outcome"] == "applied"
        )
        duplicates = sum(n - 1 for n in made.values() if n > 1)
        outcome = Counter(s.process_state.value for s in mine)
        ROWS.append(
            FaultRow(
                fault=self.fault,
                orders=len(self.order_ids),
                lost=lost,
                duplicate_effects=duplicates,
                seconds=round(seconds, 1),
                outcome=", ".join(f"{n} {state}" for state, n in sorted(outcome.items())),
            )
        )
        report = await self.topo.audit()
        assert lost == 0, f"{lost} orders lost"
        assert duplicates == 0, f"{duplicates} duplicate effects"
        assert report["ok"], report["violations"]
        assert report["orders"] >= len(self.order_ids)
        return mine


async def alerts_for(
    topo: Topology, kind: AlertKind, order_ids: Iterable[str], *, timeout: float = 15
) -> dict[str | None, Alert]:
    """The stored alerts of this kind by order, once every named order has one: an alert
    follows the state write that parks its order, so reading at once could miss the last."""
    wanted = set(order_ids)

    async def raised() -> dict[str | None, Alert] | None:
        alerts = {a.order_id: a for a in await topo.store.list_alerts(limit=1000) if a.kind is kind}
        return alerts if wanted <= set(alerts) else None

    found: dict[str | None, Alert] = await eventually(
        raised, timeout=timeout, what=f"a {kind} alert for each of {len(wanted)} orders"
    )
    return found


def everywhere(topo: Topology, **env: str) -> None:
    """Settings for every process started from now on (and every CLI call)."""
    topo.env = topo.env | env


@pytest.fixture
async def topo(hub: str, tmp_path: Path) -> AsyncIterator[Topology]:
    async with running_topology(hub, tmp_path) as t:
        yield t


# One of each per run, started when a test first asks: a RabbitMQ node takes about 10 s to boot here
# (30 on a loaded machine; PostgreSQL 1 to 5 s), and each test works in a hub of its own on them
# anyway. A missing binary skips on a laptop and fails under ORDERFLOW_REQUIRE_SERVICES=1; a server
# that fails to start is an error either way.
@pytest.fixture(scope="session")
def private_postgres() -> Iterator[PrivatePostgres]:
    try:
        server = PrivatePostgres()
    except ServerMissing as exc:
        service_missing("a private PostgreSQL server", exc)
    with server:
        yield server


@pytest.fixture(scope="session")
def private_rabbitmq() -> Iterator[PrivateRabbitMQ]:
    try:
        server = PrivateRabbitMQ()
    except ServerMissing as exc:
        service_missing("a private RabbitMQ node", exc)
    with server:
        yield server


@pytest.fixture
async def private_topo(
    hub: str,
    tmp_path: Path,
    private_postgres: PrivatePostgres,
    private_rabbitmq: PrivateRabbitMQ,
) -> AsyncIterator[Topology]:
    """A topology on the suite's private servers, for a test to stop and restart them."""
    # A test before may have left one down (its restart failed): each test starts on both up.
    for server in (private_postgres, private_rabbitmq):
        if not server.running:
            await asyncio.to_thread(server.start)
    if not listening(private_rabbitmq.port):
        await asyncio.to_thread(private_rabbitmq.start_app)
    async with running_topology(
        hub, tmp_path, store_url=private_postgres.url, rabbitmq_url=private_rabbitmq.url
    ) as t:
        yield t


def table() -> list[str]:
    lines = [
        "| fault | orders | lost | duplicate effects | fault → all terminal (s) | outcome |",
        "|---|---:|---:|---:|---:|---|",
    ]
    lines += [
        f"| {r.fault} | {r.orders} | {r.lost} | {r.duplicate_effects} | {r.seconds} | {r.outcome} |"
        for r in ROWS
    ]
    return lines


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not ROWS:
        return
    terminalreporter.section("fault-injection results")
    for line in table():
        terminalreporter.write_line(line)
    target = os.environ.get("ORDERFLOW_FAULT_REPORT")
    if target:
        Path(target).write_text("\n".join(table()) + "\n")
