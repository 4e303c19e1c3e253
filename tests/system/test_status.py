"""An order the supervisor gives up on: its submitter hears Failed, or, where the workflow
compensates the recovery limit, Compensated — through real processes."""

from __future__ import annotations

import asyncio
import json
import subprocess
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from shared.domain.journal import AlertKind, HistoryEventType
from shared.domain.states import ErrorKind, ProcessState
from tests.support.topology import Topology, all_orders, running_topology
from tests.support.waiting import eventually

pytestmark = [pytest.mark.rabbitmq, pytest.mark.postgres]


@pytest.fixture
async def topo(hub: str, tmp_path: Path) -> AsyncIterator[Topology]:
    # The first expired deadline is the last: the supervisor parks (or compensates) at once.
    async with running_topology(hub, tmp_path, ORDERFLOW_FAILURE_THRESHOLD="1") as t:
        yield t


def final_statuses(result: subprocess.CompletedProcess[str]) -> dict[str, int]:
    assert result.returncode in (0, 1), result.stderr
    return dict(json.loads(result.stdout)["final"])


async def recovered_by_the_supervisor(topo: Topology, order_id: str) -> bool:
    events = await topo.history(order_id, HistoryEventType.RECOVERED)
    return any(e.data.get("by") == f"{topo.hub}-supervisor-1" for e in events)


async def test_an_order_the_supervisor_parks_reports_failed_to_its_submitter(
    topo: Topology,
) -> None:
    await topo.start_all()
    topo.kill("inventory")  # every reserve request goes unanswered until its deadline
    waited = await asyncio.to_thread(
        topo.cli, "submit", "--json", "--wait", "--count", "3", "--timeout", "60"
    )
    assert final_statuses(waited) == {"Failed": 3}
    orders = await all_orders(topo)
    assert {s.process_state for s in orders} == {ProcessState.ERROR}
    for state in orders:
        assert state.error is not None and state.error.kind is ErrorKind.RECOVERY_LIMIT
        assert await recovered_by_the_supervisor(topo, state.order_id)
    alerts = await topo.store.list_alerts(limit=100)
    assert Counter(a.kind for a in alerts)[AlertKind.ORDER_ERROR] == 3


async def test_a_workflow_that_compensates_the_recovery_limit_undoes_what_was_done(
    topo: Topology,
) -> None:
    topo.env["ORDERFLOW_COMPENSATE_ON"] = "order=permanent,recovery-limit"
    await topo.start_all()
    topo.kill("shipping")  # reserve and charge are done; ship goes unanswered
    waiting = asyncio.create_task(
        asyncio.to_thread(topo.cli, "submit", "--json", "--wait", "--count", "3", "--timeout", "90")
    )

    async def compensating() -> bool:
        states = await all_orders(topo)
        return len(states) == 3 and all(
            s.process_state is ProcessState.COMPENSATING for s in states
        )

    await eventually(compensating, timeout=45, what="3 orders compensating at the limit")
    # Shipping is back: the undo of the unanswered ship (logged before its request) is a
    # recorded no-op at the remote service; the charge is refunded and the stock released.
    topo.serve("shipping", "agent", "shipping")
    assert final_statuses(await waiting) == {"Compensated": 3}
    orders = await all_orders(topo)
    assert {s.process_state for s in orders} == {ProcessState.COMPENSATED}
    for state in orders:
        assert state.error is not None and state.error.kind is ErrorKind.RECOVERY_LIMIT
        assert await recovered_by_the_supervisor(topo, state.order_id)
    effects = await topo.remote.ledger()
    undone = Counter(e["operation"] for e in effects if e["outcome"] == "applied")
    assert undone["payment.refund"] == 3 and undone["inventory.release"] == 3
    assert undone["shipping.create"] == 0
    assert (await topo.audit())["ok"]
