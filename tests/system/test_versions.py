"""Versioned workflows and data retention through real processes (PostgreSQL, real RabbitMQ).

A rolling upgrade: orders started on workflow v1 finish on v1 under the new deployment while new
orders run v2; an order on a version no running build knows is parked, never guessed at.
"""

from __future__ import annotations

import json
import signal
from collections import defaultdict
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from shared.domain.journal import AlertKind
from shared.domain.models import StateRecord
from shared.domain.states import ErrorKind, ProcessState, StepStatus
from tests.support.factories import order_pair
from tests.support.topology import Topology, all_orders, running_topology
from tests.support.waiting import eventually

pytestmark = [pytest.mark.rabbitmq, pytest.mark.postgres]

V1_OPERATIONS = {"inventory.reserve", "payment.charge", "shipping.create"}
V2_OPERATIONS = {"inventory.reserve", "payment.authorize", "shipping.create", "payment.capture"}


@pytest.fixture
async def topo(hub: str, tmp_path: Path) -> AsyncIterator[Topology]:
    # Steps time out in 4 s: long enough to hold v1 orders in flight across the upgrade.
    async with running_topology(hub, tmp_path, ORDERFLOW_STEP_TIMEOUT_S="4") as t:
        yield t


def submit(topo: Topology, *args: str) -> None:
    result = topo.cli("submit", "--json", *args)
    assert result.returncode == 0, result.stderr


def workflows(topo: Topology, **env: str) -> tuple[int, dict[int, dict]]:
    result = topo.cli("workflows", "--json", **env)
    assert result.returncode in (0, 1), result.stderr
    return result.returncode, {v["version"]: v for v in json.loads(result.stdout)["versions"]}


async def test_orders_started_on_v1_finish_on_v1_while_new_orders_run_v2(topo: Topology) -> None:
    # The old deployment: new orders start on v1. Shipping is not running yet, so every v1
    # order is still in flight (reserved and charged, waiting on its shipment) at the upgrade.
    for label, args in (
        ("remote", ["remote"]),
        ("submission", ["submission"]),
        ("scheduler", ["scheduler"]),
        ("supervisor", ["supervisor"]),
        ("inventory", ["agent", "inventory"]),
        ("payment", ["agent", "payment"]),
    ):
        topo.serve(label, *args, ORDERFLOW_WORKFLOW_VERSION="1")
    await topo.wait_remote()
    submit(topo, "--count", "10", "--seed", "31")

    async def charged_and_waiting() -> list[StateRecord] | None:
        states = await all_orders(topo)
        waiting = [
            s
            for s in states
            if s.steps["charge"].status is StepStatus.COMPLETED
            and s.steps["ship"].status is StepStatus.RUNNING
        ]
        return states if len(states) == 10 and len(waiting) == 10 else None

    old = {s.order_id for s in await eventually(charged_and_waiting, timeout=30, what="v1 orders")}

    # The upgrade: a new build of submission and scheduler, new orders on v2, shipping back.
    for label in ("submission", "scheduler"):
        topo.signal(label, signal.SIGTERM)
        assert topo.procs[label].wait(timeout=15) == 0
    topo.serve("submission", "submission", ORDERFLOW_WORKFLOW_VERSION="2")
    topo.serve("scheduler-v2", "scheduler", ORDERFLOW_WORKFLOW_VERSION="2")
    topo.serve("shipping", "agent", "shipping")
    submit(topo, "--count", "10", "--seed", "32")
    counts = await topo.wait_settled(20, timeout=90)
    assert counts[ProcessState.PROCESSED] == 20, counts

    states = {s.order_id: s for s in await all_orders(topo)}
    new = set(states) - old
    assert len(new) == 10
    ops: dict[str, set[str]] = defaultdict(set)
    applied: dict[tuple[str, str], int] = defaultdict(int)
    for e in await topo.remote.ledger():
        if e["outcome"] == "applied":
            ops[e["order_id"]].add(e["operation"])
            applied[(e["order_id"], e["operation"])] += 1
    assert set(applied.values()) == {1}, "a step made a second effect"
    for order_id in old:
        state = states[order_id]
        assert state.workflow_version == 1
        assert set(state.steps) == {"reserve", "charge", "ship"}
        assert state.attempt >= 2, "the new scheduler's attempt finished it"
        assert ops[order_id] == V1_OPERATIONS, order_id
    for order_id in new:
        state = states[order_id]
        assert state.workflow_version == 2
        assert set(state.steps) == {"reserve", "authorize", "ship", "capture"}
        assert all(s.status is StepStatus.COMPLETED for s in state.steps.values())
        assert ops[order_id] == V2_OPERATIONS, order_id

    code, versions = workflows(topo, ORDERFLOW_WORKFLOW_VERSION="2")
    assert code == 0
    assert (versions[1]["active"], versions[1]["finished"], versions[1]["retirable"]) == (
        0,
        10,
        True,
    )
    assert versions[2]["current"] and versions[2]["finished"] == 10
    report = await topo.audit()
    assert report["ok"], report["violations"]


async def test_an_order_on_a_version_no_build_knows_is_parked_with_an_alert(
    topo: Topology,
) -> None:
    await topo.start_all()
    # As if a newer build had started it and this (older) one took it over.
    order, state = order_pair("o-from-the-future")
    await topo.store.insert_order(order, state.model_copy(update={"workflow_version": 99}))
    submit(topo, "--count", "5", "--seed", "33")  # the scheduler goes on with the rest
    counts = await topo.wait_settled(6, timeout=60)
    assert counts[ProcessState.PROCESSED] == 5 and counts[ProcessState.ERROR] == 1, counts

    parked = await topo.store.get_state("o-from-the-future")
    assert parked is not None and parked.error is not None
    assert parked.error.kind is ErrorKind.UNKNOWN_WORKFLOW
    assert "order v99" in parked.error.message and "v1, v2" in parked.error.message
    alerts = await topo.store.list_alerts()
    assert [a.kind for a in alerts if a.order_id == "o-from-the-future"] == [AlertKind.ORDER_ERROR]
    assert all(topo.procs[label].poll() is None for label in topo.procs), "a process died"
    assert not (await topo.remote.ledger(order_id="o-from-the-future"))

    code, versions = workflows(topo)
    assert code == 1, "an unknown version in use must fail the check"
    assert versions[99]["registered"] is False and versions[99]["active"] == 1


async def test_retention_expires_the_journal_of_finished_orders_only(topo: Topology) -> None:
    await topo.start_all()
    submit(topo, "--count", "5", "--seed", "34")
    await topo.wait_settled(5, timeout=60)
    parked, state = order_pair("o-parked")
    await topo.store.insert_order(parked, state.model_copy(update={"workflow_version": 99}))
    await topo.wait_settled(6, timeout=60)
    finished = [s.order_id for s in await all_orders(topo) if s.process_state.is_terminal]
    assert len(finished) == 5 and all([await topo.history(o) for o in finished])

    # A new supervisor leader with a short retention: the journal of finished orders expires.
    topo.signal("supervisor-1", signal.SIGTERM)
    assert topo.procs["supervisor-1"].wait(timeout=15) == 0
    topo.serve(
        "supervisor-2",
        "supervisor",
        ORDERFLOW_RETENTION_S="0.5",
        ORDERFLOW_RETENTION_INTERVAL_S="0.5",
    )

    async def expired() -> bool:
        return not any([await topo.history(o) for o in finished])

    await eventually(expired, timeout=30, what="expired history of finished orders")
    for order_id in finished:
        assert await topo.store.read_compensation(order_id) == []
        assert await topo.store.get_order(order_id) is not None
    assert await topo.history("o-parked"), "an order in Error keeps its history for the operator"
    shown = topo.cli("orders", "history", finished[0])
    assert shown.returncode == 1 and "history has expired" in shown.stderr, shown.stderr
