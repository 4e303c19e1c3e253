"""A PostgreSQL failover under load: the primary lost, its synchronous standby promoted (issue 19).

Every process runs on one multi-host store URL, `postgresql://…@primary,standby/…?
target_session_attrs=read-write`. Orders are submitted, the primary is shut down immediately
(sessions cut, as when its host goes away) while more arrive, and the standby is promoted, as a
failover tool would. Nothing may be lost: the primary acknowledged a commit only once the standby
applied it (`synchronous_commit = remote_apply`), and whatever it had not acknowledged is done
again from the broker's unacknowledged messages and the supervisor's recoveries.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.nemesis.servers import ReplicatedPostgres
from shared.domain.states import ProcessState
from shared.errors import ServerMissing, StoreUnavailable
from tests.conftest import service_missing
from tests.faults.conftest import FaultRun
from tests.support.topology import running_topology
from tests.support.waiting import eventually

pytestmark = [pytest.mark.rabbitmq, pytest.mark.postgres, pytest.mark.slow]


@pytest.fixture
def replicated() -> Iterator[ReplicatedPostgres]:
    try:
        servers = ReplicatedPostgres()
    except ServerMissing as exc:
        service_missing("a private PostgreSQL primary and standby", exc)
    with servers:
        yield servers


async def _listeners(pair: ReplicatedPostgres, hub: str) -> int:
    """Sessions on the new primary LISTENing for the hub's arrivals
    (decision:new-order-claimed-on-arrival)."""
    rows = await asyncio.to_thread(
        pair.standby.sql,
        f"SELECT count(*) FROM pg_stat_activity WHERE query = 'LISTEN \"{hub}.arrivals\"'",
    )
    return int(rows.strip())


async def test_the_primary_lost_under_load_and_its_standby_promoted_loses_nothing(
    hub: str, tmp_path: Path, replicated: ReplicatedPostgres
) -> None:
    pair = replicated
    async with running_topology(hub, tmp_path, store_url=pair.url) as topo:
        run = FaultRun(topo, "PostgreSQL primary lost, standby promoted")
        await topo.start_all(schedulers=2)
        run.submit(80, seed=191)
        await run.wait_for(ProcessState.PROCESSED, 10)
        settled_before = await run.settled_count()

        await asyncio.to_thread(pair.primary.stop_immediately)
        run.struck()
        assert run.fault_at is not None
        # Accepted while there is no primary: they wait in the broker.
        more = await asyncio.to_thread(
            topo.cli, "submit", "--json", "--count", "40", "--seed", "192"
        )
        assert more.returncode == 0, more.stderr
        run.order_ids += json.loads(more.stdout)["order_ids"]
        await asyncio.to_thread(pair.standby.promote)
        promoted = time.monotonic() - run.fault_at

        async def completing_again() -> bool:
            try:
                return await run.settled_count() > settled_before
            except StoreUnavailable:
                return False  # the test's own pool, reconnecting as the processes' do

        await eventually(completing_again, timeout=60, what="orders completing after failover")
        recovered = time.monotonic() - run.fault_at

        states = await run.settle(timeout=120)  # asserts: 0 lost, 0 duplicates, audit clean
        assert len(states) == 120
        outcome = Counter(s.process_state.value for s in states)

        # Every scheduler listens for arrivals on the new primary again.
        async def listening_again() -> bool:
            return await _listeners(pair, hub) >= 2

        await eventually(listening_again, timeout=10, what="both schedulers LISTENing again")
        print(
            f"\nPostgreSQL failover: {len(states)} orders; standby promoted "
            f"{promoted:.1f} s after the primary stopped; orders completing again after "
            f"{recovered:.1f} s; all terminal after {time.monotonic() - run.fault_at:.1f} s; "
            f"0 lost, 0 duplicate effects, audit clean; {dict(outcome)}"
        )
