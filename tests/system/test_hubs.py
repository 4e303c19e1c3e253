"""Two task hubs on one RabbitMQ and one PostgreSQL server never see each other's work.

Both hubs' whole topologies run at the same time, as real processes. The second hub's name
extends the first's (`<hub>` and `<hub>_b`), so that a name matched by prefix instead of by
`<hub>.` / `<hub>-` would mix them up.

Each `running_topology` starts a remote service of its own (its own port and ledger), so in the
main test the ledgers also tell which hub's agents did the work: an agent that took the other
hub's request would have made the effect in its own hub's ledger. The last test shares one
remote service between the hubs, as two deployments calling the same real payment provider would.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aio_pika
import pytest

from services.shop.orders import message_id_of as submit_message_id
from shared.broker.rabbitmq.connection import connect
from shared.domain.coordination import SUPERVISOR_LEASE
from shared.domain.journal import HistoryEventType
from shared.domain.models import OrderData, OrderLine
from shared.domain.states import ProcessState
from shared.domain.timing import utcnow
from tests.conftest import RABBITMQ_URL, RABBITMQ_USER
from tests.support.factories import order_data
from tests.support.topology import Topology, all_orders, running_topology
from tests.support.waiting import eventually

pytestmark = [pytest.mark.rabbitmq, pytest.mark.postgres]

SHARED_ID = "o-both"
"""One order id submitted to both hubs: two independent orders, neither a duplicate of the other."""


@pytest.fixture
async def hubs(hub: str, tmp_path: Path) -> AsyncIterator[tuple[Topology, Topology]]:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    async with (
        running_topology(hub, tmp_path / "a") as a,
        running_topology(f"{hub}_b", tmp_path / "b") as b,
    ):
        yield a, b


# -- helpers


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


async def cli_json(topo: Topology, *args: str) -> Any:
    """A CLI command of the hub, run off the event loop (both hubs' commands run at once)."""
    result = await asyncio.to_thread(topo.cli, *args, "--json")
    return json.loads(ok(result))


def order_file(path: Path, order_id: str, **overrides: Any) -> str:
    path.write_text(order_data(order_id, **overrides).model_dump_json())
    return str(path)


def orders_file(path: Path, prefix: str, n: int, *more: OrderData) -> str:
    """`n` orders `<prefix>-<i>` and `more`, as JSON lines."""
    orders = [order_data(f"{prefix}-{i}") for i in range(n)] + list(more)
    path.write_text("".join(o.model_dump_json() + "\n" for o in orders))
    return str(path)


async def submit(topo: Topology, *args: str) -> list[str]:
    out = await cli_json(topo, "submit", *args)
    return list(out["order_ids"])


# The hub's names as DESIGN §5 gives them, spelled out here rather than taken from
# `shared.broker.topology.Names`, so that a change there cannot move the test along with it.
AGENTS = ("inventory", "payment", "shipping")


def input_queues(hub: str) -> list[str]:
    return [f"{hub}.orders", *(f"{hub}.agent.{agent}" for agent in AGENTS)]


def queue_names(hub: str) -> set[str]:
    """Every input queue of the hub, its dead-letter queue and its retry queue."""
    return {q for base in input_queues(hub) for q in (base, f"{base}.dlq", f"{base}.retry")}


async def leaders(a: Topology, b: Topology) -> tuple[str, str] | None:
    """Both hubs' supervisor leaders, if both hubs have a live lease at the same moment."""
    lease_a, lease_b = await asyncio.gather(
        a.store.lease_get(SUPERVISOR_LEASE), b.store.lease_get(SUPERVISOR_LEASE)
    )
    now = utcnow()
    if lease_a and lease_b and lease_a.expires_at > now and lease_b.expires_at > now:
        return lease_a.holder, lease_b.holder
    return None


async def publish_poison(
    channel: aio_pika.abc.AbstractChannel, queue: str, message_id: str
) -> None:
    poison = aio_pika.Message(
        b"{not json", message_id=message_id, type="order.submit", user_id=RABBITMQ_USER
    )
    await channel.default_exchange.publish(poison, routing_key=queue)


class AlertQueue:
    """What a hub's alert feed (`<hub>.alerts.feed`) received: every message taken off it."""

    def __init__(self, channel: aio_pika.abc.AbstractChannel, hub: str) -> None:
        self.channel = channel
        self.name = f"{hub}.alerts.feed"
        self.alert_ids: set[str] = set()

    async def drain(self) -> set[str]:
        queue = await self.channel.get_queue(self.name, ensure=True)
        while (message := await queue.get(no_ack=True, fail=False)) is not None:
            self.alert_ids.add(json.loads(message.body)["alert"]["alert_id"])
        return self.alert_ids


def effects_per_step(effects: list[dict[str, Any]]) -> Counter[tuple[str, str]]:
    return Counter((e["order_id"], e["operation"]) for e in effects if e["outcome"] == "applied")


# -- the tests


async def test_two_running_hubs_never_see_each_others_orders_messages_leases_or_alerts(
    hubs: tuple[Topology, Topology], tmp_path: Path
) -> None:
    a, b = hubs
    # One hub after the other: fourteen processes importing at once on a small machine can
    # keep a remote service from answering within start_all's patience.
    await a.start_all()
    await b.start_all()

    # Leases: each hub elects a leader of its own, both at once, from its own processes.
    holders = await eventually(lambda: leaders(a, b), timeout=20, what="a leader in each hub")
    assert holders == (f"{a.hub}-supervisor-1", f"{b.hub}-supervisor-1")

    # Orders: N to A and M to B, and one order id (same data, same message id) to both.
    shared = order_data(SHARED_ID, customer_id="alice")
    submitted = await asyncio.gather(
        submit(a, "--file", orders_file(tmp_path / "a.jsonl", "o-a", 6, shared)),
        submit(b, "--file", orders_file(tmp_path / "b.jsonl", "o-b", 4, shared)),
    )
    ids_a, ids_b = set(submitted[0]), set(submitted[1])
    assert len(ids_a) == 7 and len(ids_b) == 5
    assert ids_a & ids_b == {SHARED_ID}

    counts_a, counts_b = await asyncio.gather(a.wait_settled(7, timeout=60), b.wait_settled(5))
    assert counts_a[ProcessState.PROCESSED] == 7 and sum(counts_a.values()) == 7, counts_a
    assert counts_b[ProcessState.PROCESSED] == 5 and sum(counts_b.values()) == 5, counts_b
    stats_a, stats_b = await asyncio.gather(
        check_only_own_orders(a, ids_a), check_only_own_orders(b, ids_b)
    )
    assert not set(stats_a["queues"]) & set(stats_b["queues"])

    await check_bad_input_stays_in_its_hub(a, b, tmp_path)


async def check_only_own_orders(topo: Topology, ids: set[str]) -> dict[str, Any]:
    """The hub's store, listing, stats, history and remote ledger show its own orders only,
    each handled by its own processes; returns the hub's stats."""
    assert {s.order_id for s in await all_orders(topo)} == ids, topo.hub
    listed, stats = await asyncio.gather(
        cli_json(topo, "orders", "list", "--limit", "100"), cli_json(topo, "stats")
    )
    assert {o["order_id"] for o in listed["orders"]} == ids
    assert {o["state"] for o in listed["orders"]} == {"Processed"}
    n = len(ids)
    assert stats["hub"] == topo.hub
    assert stats["by_state"]["Processed"] == n and sum(stats["by_state"].values()) == n, stats
    # The hub's lease names its own supervisor (stats shows no leader for a moment if a starved
    # supervisor renews late, but never the other hub's).
    lease = await topo.store.lease_get(SUPERVISOR_LEASE)
    assert lease is not None and lease.holder == f"{topo.hub}-supervisor-1", lease
    assert stats["leader"] in (f"{topo.hub}-supervisor-1", None), stats["leader"]
    assert set(stats["queues"]) == queue_names(topo.hub)
    assert set(stats["queues"].values()) == {0}, stats["queues"]
    # Heartbeats: the processes the hub reports are its own.
    own = {f"{topo.hub}-{label}" for label in topo.procs}
    assert {p["name"] for p in stats["processes"]} <= own, stats["processes"]

    # The shared id is an order of this hub: recorded, run and completed once here.
    assert len(await topo.history(SHARED_ID, HistoryEventType.ORDER_SUBMITTED)) == 1
    assert len(await topo.history(SHARED_ID, HistoryEventType.EXECUTION_COMPLETED)) == 1
    # Messages: every history event was written by one of the hub's own processes (the other
    # hub's submission or scheduler taking this hub's messages would show here) ...
    actors = {e.data.get("by") for i in ids for e in await topo.history(i)}
    assert actors - {None} <= own, (topo.hub, actors)
    assert {f"{topo.hub}-submission", f"{topo.hub}-scheduler-1"} <= actors, actors
    ready = [
        json.loads(line)
        for line in topo.logs("scheduler-1").splitlines()
        if '"scheduler ready"' in line
    ]
    assert ready and ready[0]["reply_queue"].startswith(f"{topo.hub}.reply."), ready
    # ... and the hub's agents called its own remote service, for its own orders only, once per
    # step (an agent taking the other hub's request would make the effect in its own ledger).
    per_step = effects_per_step(await topo.remote.ledger())
    assert {order_id for order_id, _ in per_step} == ids, topo.hub
    assert len(per_step) == 3 * n and set(per_step.values()) == {1}, per_step
    return dict(stats)


async def alert_ids(topo: Topology) -> set[str]:
    return {x.alert_id for x in await topo.store.list_alerts(limit=1000)}


async def check_bad_input_stays_in_its_hub(a: Topology, b: Topology, tmp_path: Path) -> None:
    """A poison message and a dual-write conflict to A, a poison message to B: each raises its
    alert, on its own hub's alerts exchange, and lands in its own hub's dead-letter queue."""
    conflict = order_file(tmp_path / "mallory.json", SHARED_ID, customer_id="mallory")
    ok(await asyncio.to_thread(a.cli, "submit", "--file", conflict))
    poison_a = (f"{a.hub}.orders", "poison-a")
    poison_b = (f"{b.hub}.agent.payment", "poison-b")
    connection = await connect(RABBITMQ_URL, timeout=5, name="hub-isolation-test")
    try:
        channel = await connection.channel()
        await publish_poison(channel, *poison_a)
        await publish_poison(channel, *poison_b)
        queue_a, queue_b = AlertQueue(channel, a.hub), AlertQueue(channel, b.hub)

        async def alerted() -> tuple[set[str], ...]:
            """Both hubs' stored alerts, once each came through its hub's alerts exchange too
            (a copy routed to the other hub's queue would arrive at the same moment)."""
            stored_a, stored_b = await alert_ids(a), await alert_ids(b)
            sent_a, sent_b = await queue_a.drain(), await queue_b.drain()
            arrived = stored_a <= sent_a and stored_b <= sent_b
            done = len(stored_a) >= 2 and len(stored_b) >= 1 and arrived
            return (stored_a, stored_b, set(sent_a), set(sent_b)) if done else ()

        stored_a, stored_b, sent_a, sent_b = await eventually(
            alerted, timeout=30, interval=0.1, what="the alerts raised and published"
        )
        expected_a = {f"{poison_a[0]}.dlq": 2}  # the poison message and the conflict
        expected_b = {f"{poison_b[0]}.dlq": 1}

        async def dead_lettered() -> tuple[dict[str, int], ...]:
            depths_a, depths_b = (
                await queue_depths(channel, a.hub),
                await queue_depths(channel, b.hub),
            )
            found = (
                {q: n for q, n in depths_a.items() if n},
                {q: n for q, n in depths_b.items() if n},
            )
            return found if found == (expected_a, expected_b) else ()

        await eventually(dead_lettered, timeout=30, interval=0.1, what="the dead letters")
    finally:
        await connection.close()

    poison_alert_a = f"poison:{poison_a[0]}:{poison_a[1]}:malformed"
    poison_alert_b = f"poison:{poison_b[0]}:{poison_b[1]}:malformed"
    [conflict_alert] = [x for x in stored_a if x.startswith(f"conflict:{SHARED_ID}:")]
    assert stored_a == {poison_alert_a, conflict_alert}
    assert stored_b == {poison_alert_b}
    # Each hub's alerts exchange carried its own alerts, and none of the other hub's.
    assert sent_a == {poison_alert_a, conflict_alert}
    assert sent_b == {poison_alert_b}
    # The operator sees the same through each hub's CLI.
    listed_a, listed_b, dlq_a, dlq_b = await asyncio.gather(
        cli_json(a, "alerts", "list"),
        cli_json(b, "alerts", "list"),
        cli_json(a, "dlq", "list"),
        cli_json(b, "dlq", "list"),
    )
    assert {x["alert_id"] for x in listed_a["alerts"]} == stored_a
    assert {x["alert_id"] for x in listed_b["alerts"]} == stored_b
    rows_a = {(r["queue"], r["message_id"], r["reason"]) for r in dlq_a["messages"]}
    assert rows_a == {
        (poison_a[0], "poison-a", "malformed"),
        (f"{a.hub}.orders", message_id_of(conflict), "conflict"),
    }
    rows_b = [(r["queue"], r["message_id"], r["reason"]) for r in dlq_b["messages"]]
    assert rows_b == [(poison_b[0], "poison-b", "malformed")]

    # The conflict overwrote nothing, in either hub; B's orders are as they were.
    for topo in (a, b):
        order = await topo.store.get_order(SHARED_ID)
        assert order is not None and order.data.customer_id == "alice", topo.hub
    assert (await b.counts())[ProcessState.PROCESSED] == 5
    for topo, foreign in ((a, "poison-b"), (b, "poison-a")):
        for label in topo.procs:
            assert foreign not in topo.logs(label), (topo.hub, label)


def message_id_of(path: str) -> str:
    return submit_message_id(OrderData.model_validate_json(Path(path).read_text()))


async def queue_depths(channel: aio_pika.abc.AbstractChannel, hub: str) -> dict[str, int]:
    """Messages in each input, dead-letter and retry queue of the hub."""
    depths = {}
    for name in sorted(queue_names(hub)):
        queue = await channel.declare_queue(name, passive=True)
        depths[name] = queue.declaration_result.message_count or 0
    return depths


def serve_workers(topo: Topology) -> None:
    """The processes an order's happy path needs but the remote service: submission, a
    scheduler and the agents."""
    topo.serve("submission", "submission")
    topo.serve("scheduler-1", "scheduler")
    for agent in AGENTS:
        topo.serve(agent, "agent", agent)


async def test_two_hubs_sharing_one_remote_service_each_make_their_own_effects(
    hub: str, tmp_path: Path
) -> None:
    """Two deployments calling one remote service (as they would one payment provider): the
    same order id in both hubs is two orders, each with its own effects."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    async with contextlib.AsyncExitStack() as stack:
        a = await stack.enter_async_context(running_topology(hub, tmp_path / "a"))
        b = await stack.enter_async_context(
            running_topology(f"{hub}_b", tmp_path / "b", ORDERFLOW_REMOTE_URL=a.remote_url)
        )
        # No supervisors: nothing here times out, and fewer processes start faster. A's remote
        # service knows both hubs' accounts, each with its own keys.
        a.serve(
            "remote", "remote", ORDERFLOW_REMOTE_ACCOUNTS=f"{a.account_entry},{b.account_entry}"
        )
        serve_workers(a)
        await a.wait_remote()
        serve_workers(b)  # B's agents call A's remote service
        # The same order id, two different orders: Alice's in A, Bob's (5 items) in B.
        alice = order_file(tmp_path / "alice.json", "o-same", customer_id="alice")
        bob = order_file(
            tmp_path / "bob.json",
            "o-same",
            customer_id="bob",
            lines=[OrderLine(sku="sku-9", quantity=5, unit_price_cents=999)],
        )
        await submit(a, "--file", alice)
        assert (await a.wait_settled(1, timeout=60))[ProcessState.PROCESSED] == 1
        await submit(b, "--file", bob)
        assert (await b.wait_settled(1, timeout=60))[ProcessState.PROCESSED] == 1

        charges = [
            e
            for e in await a.remote.ledger(order_id="o-same")
            if e["operation"] == "payment.charge" and e["outcome"] == "applied"
        ]
        by_account = sorted((e["account"], e["result"]["amount_cents"]) for e in charges)
        state_b = await b.store.get_state("o-same")
        assert state_b is not None
        charge_b = state_b.steps["charge"].result
        assert charge_b is not None
        # Alice pays 2 x 12.50, Bob 5 x 9.99: one charge each, each in its own hub's account
        # (the remote service scopes idempotency keys and fences by the caller's hub).
        assert by_account == [(hub, 2500), (f"{hub}_b", 4995)], charges
        assert charge_b["amount_cents"] == 4995, charge_b
        # Each hub's audit reads its own account's effects only.
        for topo in (a, b):
            report = await topo.audit()
            assert report["ok"] and report["effects"] == 3, report
