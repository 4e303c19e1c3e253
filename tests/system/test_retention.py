"""Nothing grows without bound (issue 14), through real processes on PostgreSQL and RabbitMQ.

The supervisor leader, and only it, purges expired inbox entries, journals, finished orders and
alerts in bounded batches while orders flow, and never a parked order; the alert feed keeps only
its newest notifications and `orderflow alerts follow` takes them; `orderflow init` retires the
unbounded alerts queue of an older release.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aio_pika
import pytest
from aiormq.exceptions import ChannelNotFoundEntity

from shared.broker.port import Outgoing
from shared.broker.publisher import Publisher
from shared.broker.rabbitmq import connect as connect_port
from shared.broker.rabbitmq.connection import connect
from shared.broker.topology import Names
from shared.domain.journal import AlertKind
from shared.domain.states import ProcessState
from shared.domain.timing import utcnow
from shared.reporting import Reporter
from shared.store.port import StateQuery
from tests.conftest import RABBITMQ_URL
from tests.support.factories import order_pair
from tests.support.topology import Topology, running_topology
from tests.support.waiting import eventually

pytestmark = [pytest.mark.rabbitmq, pytest.mark.postgres]

BATCH = 5
SHORT = {
    "ORDERFLOW_INBOX_TTL_S": "1",
    "ORDERFLOW_RETENTION_S": "1",
    "ORDERFLOW_ORDER_RETENTION_S": "2",
    "ORDERFLOW_ALERT_RETENTION_S": "2",
    "ORDERFLOW_RETENTION_INTERVAL_S": "0.5",
    "ORDERFLOW_RETENTION_BATCH": str(BATCH),
    "ORDERFLOW_HEARTBEAT_S": "0.5",
}


@pytest.fixture
async def topo(hub: str, tmp_path: Path) -> AsyncIterator[Topology]:
    async with running_topology(hub, tmp_path, **SHORT) as t:
        yield t


async def supervisors(topo: Topology) -> dict[bool, dict[str, Any]]:
    """The supervisors' heartbeats, by whether each leads."""
    statuses = await topo.store.list_status(now=utcnow())
    return {bool(s.data.get("leader")): s.data for s in statuses if s.kind == "supervisor"}


async def test_the_leader_purges_what_expired_in_bounded_batches_and_keeps_parked_orders(
    topo: Topology,
) -> None:
    await topo.start_all(supervisors=2)
    result = topo.cli("submit", "--json", "--count", "23", "--seed", "14")
    assert result.returncode == 0, result.stderr
    parked, state = order_pair("o-parked")
    await topo.store.insert_order(parked, state.model_copy(update={"workflow_version": 99}))

    async def one_processed() -> str | None:
        found = await topo.store.query_states(
            StateQuery(states=frozenset({ProcessState.PROCESSED})), limit=1
        )
        return found[0].order_id if found else None

    finished = await eventually(one_processed, timeout=60, what="an order Processed")

    async def purged() -> dict[str, int] | None:
        counts = await topo.store.record_counts()
        # Every finished order gone with its journal; the inbox and the alerts emptied.
        left = {k: counts[k] for k in ("orders", "state", "inbox", "alerts")}
        return counts if left == {"orders": 1, "state": 1, "inbox": 0, "alerts": 0} else None

    counts = await eventually(purged, timeout=90, interval=0.2, what="everything expired purged")
    parked_state = await topo.store.get_state("o-parked")
    assert parked_state is not None and parked_state.process_state is ProcessState.ERROR
    assert counts["history"] == len(await topo.history("o-parked")) > 0, "parked: journal kept"
    shown = topo.cli("orders", "show", finished)
    assert shown.returncode == 1 and "is deleted 2 s after" in shown.stderr, shown

    async def reported() -> dict[bool, dict[str, Any]] | None:
        found = await supervisors(topo)
        leader = found.get(True, {}).get("retention", {})
        return found if leader.get("deleted", {}).get("orders", 0) >= 23 else None

    found = await eventually(reported, timeout=20, what="the leader's retention in its heartbeat")
    leader = found[True]["retention"]
    # Bounded: 23 finished orders, at most BATCH a statement.
    assert leader["batches"]["orders"] >= -(-23 // BATCH)
    assert leader["deleted"]["inbox"] > 0 and leader["deleted"]["alerts"] >= 1
    assert set(leader["passes"]) == {"inbox", "journal", "orders", "alerts"}
    # Only the leader purges: the standby has run no batch.
    assert found[False]["retention"]["batches"] == {}, found[False]


# -- the alert feed -----------------------------------------------------------------------------


@pytest.fixture
async def feed_topo(hub: str, tmp_path: Path) -> AsyncIterator[Topology]:
    async with running_topology(hub, tmp_path, ORDERFLOW_ALERTS_QUEUE_MAX_LENGTH="5") as t:
        yield t


async def depth(queue: str) -> int:
    connection = await connect(RABBITMQ_URL, timeout=5, name="retention-test")
    try:
        declared = await (await connection.channel()).declare_queue(queue, passive=True)
        return int(declared.declaration_result.message_count or 0)
    finally:
        await connection.close()


async def test_the_alert_feed_keeps_its_newest_notifications_and_follow_takes_them(
    feed_topo: Topology,
) -> None:
    topo = feed_topo
    names = Names(topo.hub)
    connection = await connect_port(RABBITMQ_URL, timeout=5, name="alert-raiser")
    try:
        publisher = await Publisher.open(connection, timeout=10)
        reporter = Reporter(topo.store, publisher, names, source="test")
        for i in range(12):
            await reporter.alert(AlertKind.ORDER_ERROR, f"alert {i}", alert_id=f"a-{i:02d}")
        # Not an alert: dropped by the reader with a line saying why.
        await publisher.publish_raw(
            Outgoing(b'{"schema_version": 1}', message_id="junk", type="order.submit"),
            exchange=names.alerts,
            routing_key="",
        )
    finally:
        await connection.close()

    # Bounded: the oldest were dropped (a quorum queue may overshoot its limit by one).
    assert 5 <= await depth(names.alert_feed) <= 6
    followed = topo.cli("alerts", "follow", "--burst", "--json")
    assert followed.returncode == 0, followed.stderr
    taken = [json.loads(line)["alert_id"] for line in followed.stdout.splitlines()]
    assert taken[-4:] == ["a-08", "a-09", "a-10", "a-11"] and len(taken) in (4, 5), taken
    assert "a notification dropped" in followed.stderr, followed.stderr
    assert await depth(names.alert_feed) == 0, "each notification taken was acknowledged"
    # The store keeps every alert, whatever the feed dropped.
    listed = topo.cli("alerts", "list", "--json")
    assert len(json.loads(listed.stdout)["alerts"]) == 12


async def test_init_retires_the_unbounded_alerts_queue_of_an_older_release(
    feed_topo: Topology,
) -> None:
    topo = feed_topo
    names = Names(topo.hub)
    connection = await connect(RABBITMQ_URL, timeout=5, name="old-release")
    try:
        channel = await connection.channel()
        # What an older release declared: a durable queue named like the exchange, no bound.
        old = await channel.declare_queue(
            names.alerts, durable=True, arguments={"x-queue-type": "quorum"}
        )
        exchange = await channel.get_exchange(names.alerts)
        await old.bind(exchange)
        for i in range(3):
            await exchange.publish(aio_pika.Message(f"old {i}".encode()), routing_key="")
    finally:
        await connection.close()

    async def held() -> bool:
        return await depth(names.alerts) == 3

    await eventually(held, what="the old queue holding its notifications")
    init = topo.cli("init")
    assert init.returncode == 0, init.stderr
    assert f"{names.alerts}, with 3 notifications" in init.stdout, init.stdout
    with pytest.raises(ChannelNotFoundEntity):
        await depth(names.alerts)
    again = topo.cli("init")
    assert again.returncode == 0 and "deleted" not in again.stdout, again.stdout
    assert await depth(names.alert_feed) == 3, "the feed, bound all along, is kept"


def test_a_hub_without_its_feed_says_to_run_init() -> None:
    hub = f"t{uuid.uuid4().hex[:12]}"  # never initialised
    done = subprocess.run(
        [sys.executable, "-m", "services.cli", "--hub", hub, "alerts", "follow", "--burst"],
        capture_output=True,
        text=True,
        timeout=60,
        env=os.environ | {"ORDERFLOW_RABBITMQ_URL": RABBITMQ_URL},
    )
    assert done.returncode == 2 and "does not exist: run `orderflow init`" in done.stderr
