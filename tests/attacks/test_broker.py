"""Issue 33's attacks on the broker (items 9, 10 and 14), each as the broker user it comes from:
the generated definitions in a scratch vhost (tests/support/vhost.py, the default limits of the
compose deployment), submission and the HTTP API each under its own user, PostgreSQL.

- An application's user declared 1,008 queues, and a restarting scheduler then could not
  declare its reply queue (the vhost's limit of 1024): applications may declare no queue, and
  submission declares at most `STATUS_QUEUES_PER_APP` status queues for one.
- The API held the operator's broker user, which may take and acknowledge the alert feed: the
  API's own user may not, and every operator endpoint of the API works with it.
- Listing the dead letters took each one and gave it back by closing the channel, which counts
  as a delivery (RabbitMQ 4.3 counts it as a failed one, 4.0-4.2 every return), past 4.x's
  default delivery limit of 20 a letter was dropped: listing 25 times leaves every letter, and
  the DLQs' policy is the broker's. RabbitMQ 4.x's counting is run on the memory broker.

One vhost and one topology serve the module's cases.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aio_pika
import aiormq
import pytest
import pytest_asyncio

from deployment.rabbitmq import BrokerLimits, definitions
from services.operator.alerts import alert_letters
from shared.broker import dead_letters
from shared.broker.consumer import REASON
from shared.broker.memory import MemoryBroker, connect
from shared.broker.memory.objects import RABBITMQ_4_0, RABBITMQ_4_3, QuorumRules
from shared.broker.port import Outgoing
from shared.broker.private import STATUS_QUEUES_PER_APP
from shared.broker.publisher import Publisher
from shared.broker.topology import Names, QueuePolicy, declare_topology
from shared.domain.messages import OrderStatus, OrderStatusUpdate, SubmitOrder
from shared.domain.states import ProcessState
from tests.support.api import ApiClient, start_api, token
from tests.support.factories import order_data
from tests.support.topology import Topology, running_topology
from tests.support.vhost import Broker, consume, rabbitmqctl, refused, scratch_vhost
from tests.support.waiting import eventually

pytestmark = [
    pytest.mark.rabbitmq,
    pytest.mark.postgres,
    pytest.mark.asyncio(loop_scope="module"),
]

LISTINGS = 25
"""More than RabbitMQ 4.x's default delivery limit of 20."""


@dataclass
class World:
    broker: Broker
    topo: Topology
    api: ApiClient
    operator_token: str

    @property
    def names(self) -> Names:
        return Names(self.broker.hub)

    @property
    def shop(self) -> str:
        return self.broker.apps[0]

    async def as_user(self, role: str) -> aio_pika.abc.AbstractConnection:
        return await self.broker.connect(role)

    @property
    def customer(self) -> str:
        """An application whose status queues the flood of the first case leaves alone."""
        return self.broker.apps[2]

    async def submit_raw(self, body: bytes, message_id: str, app: str | None = None) -> None:
        """A message to the orders queue, as an application's user (the shop's unless
        named), with its `user_id`."""
        connection = await self.broker.port(app or self.shop)
        try:
            publisher = await Publisher.open(connection, timeout=10)
            await publisher.publish_raw(
                Outgoing(body, message_id=message_id, type="order.submit"),
                exchange=self.names.submit,
                routing_key=self.names.orders,
            )
        finally:
            await connection.close()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def world(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[World]:
    hub = f"t{random.getrandbits(48):012x}"
    apps = (f"{hub}-shop", f"{hub}-web", f"{hub}-quiet")
    async with scratch_vhost(hub, apps=apps) as broker:
        workdir = tmp_path_factory.mktemp("broker-attacks")
        async with running_topology(
            hub, workdir, ORDERFLOW_RABBITMQ_URL=broker.url("admin")
        ) as topo:
            topo.serve("submission", "submission", ORDERFLOW_RABBITMQ_URL=broker.url("submission"))
            # The API as the compose deployment runs it: an application's user, and its own.
            api = await start_api(
                topo,
                ORDERFLOW_RABBITMQ_URL=broker.url(apps[1]),
                ORDERFLOW_API_RABBITMQ_URL=broker.url("api"),
            )
            try:
                yield World(broker, topo, api, token(topo, "operator", "otto"))
            finally:
                await api.close()


# -- item 9: no application can stop the vhost


async def _declares(connection: aio_pika.abc.AbstractConnection, names: list[str]) -> int:
    """Declare each queue (a fresh channel after each refusal, which closes one): how many the
    broker allowed."""
    allowed, channel = 0, await connection.channel()
    for name in names:
        if channel.is_closed:
            channel = await connection.channel()
        try:
            await channel.declare_queue(name, durable=True, arguments={"x-expires": 600_000})
        except aiormq.exceptions.AMQPError:
            continue
        allowed += 1
    return allowed


async def test_an_application_declares_no_queue_and_a_scheduler_always_declares_its_own(
    world: World,
) -> None:
    n = world.names
    app = await world.as_user(world.shop)
    try:
        # 1,100 queues with the application's own prefix, where it had configure permission.
        tried = [f"{n.status_prefix(world.shop)}flood-{i}" for i in range(1100)]
        assert await _declares(app, tried) == 0
        assert tried[0] in await refused(lambda: _declare_one(app, tried[0]))
    finally:
        await app.close()
    # Nor through submission: orders naming 80 status queues of their own get 64 of them.
    wanted = [n.status_queue(world.shop) for _ in range(80)]
    for i, reply_to in enumerate(wanted):
        order = SubmitOrder(order=order_data(f"o-flood-{i}"), reply_to=reply_to)
        await world.submit_raw(order.to_json(), f"flood-{i}")

    async def recorded() -> bool:
        return (await world.topo.counts())[ProcessState.PENDING] >= len(wanted)

    await eventually(recorded, timeout=60, what="the flood's orders recorded")
    listed = rabbitmqctl("-q", "list_queues", "-p", n.hub, "name").stdout.split()
    made = [q for q in listed if q.startswith(n.status_prefix(world.shop))]
    assert len(made) == STATUS_QUEUES_PER_APP and set(made) <= set(wanted)
    assert "as many status queues as it may" in world.topo.logs("submission")
    # A scheduler (re)starting declares and binds its reply queue.
    scheduler = await world.as_user("scheduler")
    try:
        channel = await scheduler.channel()
        reply = await channel.declare_queue(n.reply_queue("scheduler-1"), exclusive=True)
        await reply.bind(n.replies, routing_key=reply.name)
    finally:
        await scheduler.close()


async def _declare_one(connection: aio_pika.abc.AbstractConnection, name: str) -> object:
    return await (await connection.channel()).declare_queue(name, durable=True)


async def test_an_application_past_its_connection_limit_is_refused(world: World) -> None:
    limit = BrokerLimits().app_max_connections
    held = [await world.as_user(world.shop) for _ in range(limit)]
    try:
        # The broker answers the open with a close (NOT_ALLOWED, "user connection limit").
        with pytest.raises(aiormq.exceptions.AMQPError, match=r"Connection\.Close"):
            async with asyncio.timeout(10):
                await aiormq.connect(world.broker.url(world.shop))
    finally:
        for connection in held:
            await connection.close()
    # Every user of the definitions has one, services' and applications' alike.
    document = definitions(world.names.hub, world.names.hub, apps=world.broker.apps)
    assert all(u["limits"]["max-connections"] > 0 for u in document["users"])


# -- item 10: the API's own broker user


async def test_the_apis_user_cannot_take_the_alert_feed_yet_every_operator_endpoint_works(
    world: World,
) -> None:
    n, api, otto = world.names, world.api, world.operator_token
    own = await world.as_user("api")
    try:
        assert n.alert_feed in await refused(lambda: consume(own, n.alert_feed))
        channel = await own.channel()
        feed = await channel.get_queue(n.alert_feed, ensure=True)  # passive: needs nothing
        assert n.alert_feed in await refused(lambda: feed.get(fail=False))
    finally:
        await own.close()
    # A letter the API lists, shows, replays (taken as its sender's again: dead-lettered as
    # invalid once more, not as unauthorised) and purges; an order it cancels; the rest.
    await world.submit_raw(b'{"schema_version": 1, "order": {}}', "bad-api")

    async def listed() -> list[dict[str, object]]:
        answer = await api.call("GET", "/ops/dead-letters", otto, queue="orders")
        assert answer.status == 200, answer
        return [m for m in answer.body["messages"] if m["message_id"] == "bad-api"]

    [letter] = await eventually(listed, timeout=30, what="the bad order dead-lettered")
    assert letter["reason"] == "invalid"
    shown = await api.call("GET", "/ops/dead-letter", otto, message_id="bad-api", queue="orders")
    assert shown.status == 200 and shown.body["messages"][0]["headers"][REASON] == "invalid"
    replayed = await api.call(
        "POST", "/ops/dead-letters/replay", otto, {"message_ids": ["bad-api"], "queue": "orders"}
    )
    assert replayed.status == 200 and len(replayed.body["replayed"]) == 1, replayed

    async def back_as_invalid() -> bool:
        return [m["reason"] for m in await listed()] == ["invalid"]

    await eventually(back_as_invalid, timeout=30, what="the replay dead-lettered again")
    purged = await api.call("DELETE", "/ops/dead-letters", otto, confirm="purge", queue="orders")
    assert purged.status == 200 and purged.body["purged"][n.dlq(n.orders)] >= 1, purged
    stats = await api.call("GET", "/ops/stats", otto)
    assert stats.status == 200 and all(v is not None for v in stats.body["queues"].values())
    # By an application of its own: the first case's flood used up the shop's status queues.
    statuses = n.status_queue(world.customer)
    order = SubmitOrder(order=order_data("o-cancel"), reply_to=statuses)
    await world.submit_raw(order.to_json(), "o-cancel", world.customer)
    order_id = f"{world.customer}/o-cancel"

    async def pending() -> bool:
        state = await world.topo.store.get_state(order_id)
        return state is not None and state.process_state is ProcessState.PENDING

    await eventually(pending, timeout=30, what="the order to cancel recorded")
    cancelled = await api.call("POST", "/ops/order/cancel", otto, order_id=order_id)
    assert cancelled.status == 200, cancelled
    # Its application is told, by the API's own user (the one allowed onto the status exchange).
    told = await _statuses(world, statuses)
    assert (OrderStatus.CANCELLED, world.broker.user("api")) in told, told
    for path, params in [
        ("/ops/orders", {}),
        ("/ops/order", {"order_id": order_id}),
        ("/ops/order/history", {"order_id": order_id}),
        ("/ops/failures", {}),
        ("/ops/alerts", {}),
        ("/ops/processes", {}),
    ]:
        answer = await api.call("GET", path, otto, **params)
        assert answer.status == 200, (path, answer)
    assert "ACCESS_REFUSED" not in world.topo.logs("api")


async def _statuses(world: World, queue: str) -> list[tuple[OrderStatus, str | None]]:
    """The statuses on an application's status queue, as its application reads them, once one
    says Cancelled: (status, the broker-checked sender)."""
    app = await world.as_user(world.customer)
    seen: list[tuple[OrderStatus, str | None]] = []
    try:

        async def cancelled() -> bool:
            channel = await app.channel()  # closed by the broker if the queue is not there
            try:
                declared = await channel.get_queue(queue, ensure=True)
            except aiormq.exceptions.ChannelNotFoundEntity:
                return False
            while (message := await declared.get(no_ack=True, fail=False)) is not None:
                update = OrderStatusUpdate.model_validate_json(message.body)
                seen.append((update.status, message.user_id))
            await channel.close()
            return any(status is OrderStatus.CANCELLED for status, _ in seen)

        await eventually(cancelled, timeout=30, what="the Cancelled status told")
    finally:
        await app.close()
    return seen


async def test_the_api_refuses_to_start_with_the_operators_url(world: World) -> None:
    """An upgraded deployment that still gives the API the operator's user: a clear refusal."""
    proc = world.topo.serve(
        "api-old",
        "api",
        ORDERFLOW_API_PORT="1",
        ORDERFLOW_RABBITMQ_URL=world.broker.url(world.broker.apps[1]),
        ORDERFLOW_API_OPERATOR_RABBITMQ_URL=world.broker.url("operator"),
    )
    assert await asyncio.to_thread(proc.wait, 60) != 0
    log = world.topo.logs("api-old")
    assert "ORDERFLOW_API_OPERATOR_RABBITMQ_URL is set, and no longer read" in log
    assert "ORDERFLOW_API_RABBITMQ_URL" in log


# -- item 14: listing the dead letters spends no delivery


async def test_listing_the_dead_letters_25_times_leaves_every_letter(world: World) -> None:
    n = world.names
    ids = [f"bad-listed-{i}" for i in range(3)]
    for message_id in ids:
        await world.submit_raw(b'{"schema_version": 1, "order": {}}', message_id)
    api = await world.broker.port("api")
    try:

        async def letters() -> list[str]:
            rows = await dead_letters.dead_letters(api, [n.orders])
            return sorted(str(r["message_id"]) for r in rows if r["message_id"] in ids)

        async def all_there() -> bool:
            return await letters() == ids

        await eventually(all_there, timeout=30, what="the letters dead-lettered")
        for _ in range(LISTINGS):
            assert await letters() == ids
        found = await dead_letters.find(api, [n.orders], ids[0])
        assert [f.row["reason"] for f in found] == ["invalid"]
    finally:
        await api.close()
    # The broker applies the definitions' policy to every DLQ: on RabbitMQ 4.x (which this
    # machine does not run) it lifts the default limit of 20, also for queues declared before.
    [policy] = _limit_policies(n)
    assert policy["definition"]["delivery-limit"] >= 2**31 - 1
    listed = rabbitmqctl("-q", "list_queues", "-p", n.hub, "name", "policy").stdout.splitlines()
    applied = dict(line.split("\t") for line in listed if "\t" in line)
    dlqs = [*(n.dlq(q) for q in n.input_queues()), n.alert_dead_letters]
    assert {q: applied.get(q) for q in dlqs} == dict.fromkeys(dlqs, policy["name"])
    assert not {q for q, name in applied.items() if name == policy["name"]} - set(dlqs)
    held = rabbitmqctl("-q", "list_policies", "-p", n.hub, "--formatter", "json").stdout
    [ours] = [p for p in json.loads(held) if p["name"] == policy["name"]]
    assert json.loads(ours["definition"]) == policy["definition"]


def _limit_policies(names: Names) -> list[dict[str, Any]]:
    """The generated definitions' policies that set a delivery limit."""
    document = definitions(names.hub, names.hub, apps=())
    return [p for p in document["policies"] if "delivery-limit" in p["definition"]]


@pytest.mark.parametrize(
    ("rules", "with_policy"),
    [(RABBITMQ_4_0, True), (RABBITMQ_4_3, False), (RABBITMQ_4_3, True)],
    ids=["4.0-4.2 with the definitions' policy", "4.3 without it", "4.3 with it"],
)
async def test_on_rabbitmq_4_listing_25_times_leaves_every_letter(
    rules: QuorumRules, with_policy: bool
) -> None:
    """RabbitMQ 4's counting on the memory broker: a limit of 20 where none is set; every
    return counted before 4.3, a `basic.nack` not from 4.3 on, a closed channel always. With
    the generated definitions' policy loaded, or on 4.3 without it, no letter is lost."""
    assert await _left_after_listings(rules, with_policy=with_policy) == 3


async def test_the_memory_model_drops_letters_where_nothing_lifts_the_limit() -> None:
    """The model bites: on 4.0-4.2 without the policy, the 21st listing loses every letter."""
    assert await _left_after_listings(RABBITMQ_4_0, with_policy=False) == 0


async def _left_after_listings(rules: QuorumRules, *, with_policy: bool) -> int:
    broker = MemoryBroker(rules=rules)
    names = Names("h")
    if with_policy:  # as the generated definitions, once loaded, give the broker
        for policy in _limit_policies(names):
            limit = policy["definition"]["delivery-limit"]
            broker.delivery_limit_policies.append((policy["pattern"], limit))
    connection = connect(broker, "h-operator", name="listings")
    admin = await connection.admin()
    await declare_topology(
        admin, names, QueuePolicy(quorum=True, delivery_limit=5, orders_max_length=100)
    )
    sender = await connection.sender(timeout=5)
    for i in range(3):
        for exchange, message_id in [
            (names.dlq(names.orders), f"m-{i}"),
            (names.alert_dead_letters, f"a-{i}"),
        ]:
            letter = Outgoing(b"{}", message_id=message_id, persistent=False)
            await sender.publish(letter, exchange=exchange, routing_key="")
    for _ in range(LISTINGS):
        await dead_letters.dead_letters(connection, [names.orders])
        await alert_letters(connection, names)  # `orderflow alerts undelivered`
    left = len(await dead_letters.dead_letters(connection, [names.orders]))
    assert len(await alert_letters(connection, names)) == left
    return left
