"""Least privilege on the real RabbitMQ: the generated definitions, loaded into a vhost of this
test's own, let each user do what its service does and refuse the rest; and the real processes,
each under its own user, take orders to Processed without a password in their logs. Last, the
postgres profile's init script against the real PostgreSQL.

The vhost is `tests/support/vhost.py`'s: the definitions loaded as the compose deployment loads
them, deleted afterwards.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import shutil
import subprocess
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aio_pika
import aiormq
import asyncpg
import pytest

from shared.broker.access import SERVICE_ROLES
from shared.broker.consumer import REASON
from shared.broker.envelope import SEAL, SENDER
from shared.broker.port import Connection, Outgoing
from shared.broker.private import STATUS_QUEUE, Expected, PrivateQueue, ReplyRouter
from shared.broker.publisher import Publisher
from shared.broker.seal import Sealed, seal_key
from shared.broker.senders import Senders
from shared.broker.topology import Names
from shared.config import load_settings
from shared.domain.messages import (
    OrderStatus,
    OrderStatusUpdate,
    StepAction,
    StepOutcome,
    StepReply,
    StepRequest,
    SubmitOrder,
)
from shared.domain.states import ProcessState
from shared.domain.timing import utcnow
from shared.metrics import REGISTRY
from shared.store.postgres import PostgresStore
from tests.conftest import POSTGRES_URL, service_missing
from tests.support.api import start_api, token
from tests.support.factories import order_data
from tests.support.topology import Topology, free_port, running_topology
from tests.support.vhost import (
    AMQP_HOST,
    ROOT,
    Broker,
    bind_exchanges,
    consume,
    declare,
    publish,
    refused,
    scratch_vhost,
    serve_each_under_its_own_user,
    take_dead_letters,
)
from tests.support.waiting import eventually

pytestmark = [pytest.mark.rabbitmq, pytest.mark.postgres]


@pytest.fixture
async def broker(hub: str) -> AsyncIterator[Broker]:
    async with scratch_vhost(hub) as b:
        yield b


async def test_each_user_may_do_what_its_service_does_and_nothing_more(broker: Broker) -> None:
    n = Names(broker.hub)
    app_a, app_b = broker.apps
    conns = {role: await broker.connect(role) for role in (*SERVICE_ROLES, *broker.apps)}
    try:
        agent, app = conns["agent-inventory"], conns[app_a]
        # An agent consumes its own queue and replies through the replies exchange ...
        await consume(agent, n.agent("inventory"))
        await publish(agent, n.replies, f"{n.hub}.reply.scheduler-x.1")
        # ... but cannot read the orders or another agent's requests, nor publish anything else.
        assert "orders" in await refused(lambda: consume(agent, n.orders))
        await refused(lambda: consume(agent, n.agent("payment")))
        assert "amq.default" in await refused(lambda: publish(agent, "", n.orders))
        await refused(lambda: publish(agent, n.exchange, n.orders))
        assert "topic" in await refused(lambda: publish(agent, n.replies, n.orders))
        await refused(lambda: declare(agent, f"{n.hub}.mine"))

        # A submitting application submits through the submit exchange only ...
        await publish(app, n.submit, n.orders)
        assert "direct" in await refused(lambda: publish(app, n.exchange, n.agent("payment")))
        await refused(lambda: publish(app, "", n.orders))
        await refused(lambda: consume(app, n.orders))
        # ... and follows its orders on its own status queues, never another application's:
        # it reads them, and declares and binds nothing (submission does both for it).
        own_name = n.status_queue(app_a)
        assert own_name in await refused(lambda: declare(app, own_name))
        await (await conns["submission"].channel()).declare_queue(
            own_name, durable=True, auto_delete=False, arguments=STATUS_QUEUE
        )
        await consume(app, own_name)
        own = await (await app.channel()).get_queue(own_name, ensure=True)
        await refused(lambda: own.bind(n.status, routing_key=own.name))
        await refused(lambda: declare(app, n.status_queue(app_b)))
        b_queue = await (await conns["submission"].channel()).declare_queue(
            f"{n.status_prefix(app_b)}kept", durable=True, auto_delete=False, arguments=STATUS_QUEUE
        )
        await consume(conns[app_b], b_queue.name)
        assert b_queue.name in await refused(lambda: consume(app, b_queue.name))
        # No exchange-to-exchange loop (status messages into the orders queue): an application
        # may read no exchange, so it can bind none as a source.
        await refused(lambda: bind_exchanges(app, destination=n.submit, source=n.status))
        await refused(lambda: bind_exchanges(app, destination=n.submit, source=n.replies))

        # The core services: each its own input, nothing declared, nothing of the others'.
        await consume(conns["submission"], n.orders)
        await refused(lambda: declare(conns["submission"], f"{n.hub}.mine"))
        await refused(lambda: publish(conns["submission"], n.exchange, n.agent("payment")))
        await publish(conns["supervisor"], n.alerts, "")
        await refused(lambda: consume(conns["supervisor"], n.orders))
        await refused(lambda: publish(conns["supervisor"], n.exchange, n.orders))
        scheduler_q = await declare(conns["scheduler"], n.reply_queue("scheduler-t"))
        await scheduler_q.bind(n.replies, routing_key=scheduler_q.name)  # type: ignore[attr-defined]
        await publish(conns["scheduler"], n.exchange, n.agent("payment"))
        await refused(lambda: consume(conns["scheduler"], n.orders))
        await refused(lambda: declare(conns["scheduler"], n.status_queue(app_a)))
        await refused(lambda: publish(conns["scheduler"], "", n.orders))

        # The operator reads and replays dead letters, and takes no live message; it reaches
        # an input queue only through that queue's replay exchange, never the direct one.
        channel = await conns["operator"].channel()
        await (await channel.get_queue(n.dlq(n.orders), ensure=True)).get(fail=False)
        await (await channel.get_queue(n.alert_dead_letters, ensure=True)).get(fail=False)
        await publish(conns["operator"], n.replay(n.orders), "")
        await publish(conns["operator"], n.replay(n.agent("payment")), "")
        assert "direct" in await refused(lambda: publish(conns["operator"], n.exchange, n.orders))
        await refused(lambda: consume(conns["operator"], n.orders))
        await refused(lambda: declare(conns["operator"], f"{n.hub}.mine"))

        # The API's own user reads and replays dead letters like the operator, and nothing of
        # the alert feed, which the operator may follow; it declares nothing.
        api = conns["api"]
        channel = await api.channel()
        await (await channel.get_queue(n.dlq(n.agent("payment")), ensure=True)).get(fail=False)
        await publish(api, n.replay(n.orders), "")
        assert "alerts.feed" in await refused(lambda: consume(api, n.alert_feed))
        await refused(lambda: consume(api, n.alert_dead_letters))
        await refused(lambda: publish(api, n.exchange, n.orders))
        await refused(lambda: publish(api, n.alerts, ""))
        await refused(lambda: declare(api, f"{n.hub}.mine"))
        await consume(conns["operator"], n.alert_feed)

        # The notifier reads the alert feed and sets aside into the feed's own DLQ, which no
        # one else may write; it raises no alert and reads nothing else.
        await consume(conns["notifier"], n.alert_feed)
        await publish(conns["notifier"], n.alert_dead_letters, "")
        await refused(lambda: publish(conns["notifier"], n.alerts, ""))
        await refused(lambda: consume(conns["notifier"], n.orders))
        await refused(lambda: consume(conns["notifier"], n.alert_dead_letters))
        await refused(lambda: publish(conns["operator"], n.alert_dead_letters, ""))
        await refused(lambda: publish(conns["supervisor"], n.alert_dead_letters, ""))

        # Dead letters are the system's own: each DLQ is written by its own consumer only.
        await publish(agent, n.dlq(n.agent("inventory")), "")
        for role in ("agent-inventory", "submission", app_a, "scheduler", "operator"):
            await refused(lambda r=role: publish(conns[r], n.dead_letters, n.agent("payment")))
            await refused(lambda r=role: publish(conns[r], n.dlq(n.agent("payment")), ""))
        await refused(lambda: publish(agent, n.dlq(n.orders), ""))
        await refused(lambda: publish(agent, n.replay(n.agent("payment")), ""))
        await refused(lambda: publish(app, n.replay(n.orders), ""))
    finally:
        for connection in conns.values():
            await connection.close()


async def test_the_broker_checks_every_user_id(broker: Broker) -> None:
    """A message's `user_id` is what its receivers trust: the broker refuses one that is not
    the publishing connection's user, so no process can claim to be another."""
    n = Names(broker.hub)
    agent = await broker.connect("agent-inventory")
    try:
        channel = await agent.channel(publisher_confirms=True)
        replies = await channel.get_exchange(n.replies, ensure=False)
        forged = aio_pika.Message(b"{}", message_id="m", user_id=broker.user("agent-payment"))
        with pytest.raises(aiormq.exceptions.ChannelPreconditionFailed, match="user_id"):
            await replies.publish(forged, f"{n.hub}.reply.scheduler-x.1", timeout=5)
    finally:
        await agent.close()


def _no_secrets(topo: Topology, passwords: dict[str, str], extra: str = "") -> None:
    for label in topo.procs:
        log = topo.logs(label)
        assert "ACCESS_REFUSED" not in log, f"{label} was refused something:\n{log[-3000:]}"
        leaked = [v for v, p in passwords.items() if p in log]
        assert not leaked, f"{label}'s log shows the password of {leaked}"
    assert not [v for v, p in passwords.items() if p in extra]


async def test_the_real_processes_work_end_to_end_each_under_its_own_user(
    broker: Broker, tmp_path: Path
) -> None:
    async with running_topology(
        broker.hub, tmp_path, ORDERFLOW_RABBITMQ_URL=broker.url("admin")
    ) as topo:
        # The remote service needs no broker at all: give it a URL that cannot log in.
        topo.serve("remote", "remote", ORDERFLOW_RABBITMQ_URL=f"amqp://nobody@{AMQP_HOST}/none")
        ports = {"submission": {"ORDERFLOW_METRICS_PORT": str(free_port())}}
        for label, args, role in [
            ("submission", ["submission"], "submission"),
            ("scheduler-1", ["scheduler"], "scheduler"),
            ("supervisor-1", ["supervisor"], "supervisor"),
            *((name, ["agent", name], f"agent-{name}") for name in ("inventory", "payment")),
            ("shipping", ["agent", "shipping"], "agent-shipping"),
        ]:
            env = {"ORDERFLOW_RABBITMQ_URL": broker.url(role), **ports.get(label, {})}
            topo.serve(label, *args, **env)
        await topo.wait_remote()

        async def healthy() -> str | None:
            answer = topo.cli("health", **ports["submission"])
            return answer.stdout if answer.returncode == 0 else None

        # The container healthcheck's view: connected to the broker as its user, store answers.
        checks = await eventually(healthy, timeout=30, interval=0.5, what="submission healthy")
        assert '"broker": true' in checks and '"store": true' in checks

        app = broker.apps[0]
        submitted = topo.cli(
            "submit", "--count", "5", "--wait", "--timeout", "90",
            ORDERFLOW_RABBITMQ_URL=broker.url(app),
        )  # fmt: skip
        assert submitted.returncode == 0, submitted.stdout + submitted.stderr
        assert "Completed: 5" in submitted.stdout, submitted.stdout
        counts = await topo.wait_settled(5, timeout=60)
        assert counts[ProcessState.PROCESSED] == 5

        operator = {"ORDERFLOW_RABBITMQ_URL": broker.url("operator")}
        dead = topo.cli("dlq", "list", "--json", **operator)
        assert dead.returncode == 0, dead.stderr
        stats = topo.cli("stats", "--json", **operator)
        assert stats.returncode == 0, stats.stderr
        # An application cannot read the dead letters.
        refused_dlq = topo.cli("dlq", "list", ORDERFLOW_RABBITMQ_URL=broker.url(app))
        assert refused_dlq.returncode != 0
        assert "ACCESS_REFUSED" in refused_dlq.stderr + refused_dlq.stdout

        # The HTTP API as the compose deployment runs it: an application's user of its own,
        # and a user of its own for the dead letters and queue depths.
        api = await start_api(
            topo,
            ORDERFLOW_RABBITMQ_URL=broker.url(broker.apps[1]),
            ORDERFLOW_API_RABBITMQ_URL=broker.url("api"),
        )
        try:
            shop, otto = token(topo, "shop", "acme"), token(topo, "operator", "otto")
            body = order_data("o-web").model_dump(mode="json")
            placed = await api.call("POST", "/orders", shop, body)
            assert placed.status == 201, placed

            async def completed() -> bool:
                seen = await api.call("GET", "/orders/o-web", shop)
                return seen.body["status"] == "Completed"

            await eventually(completed, timeout=60, what="the API's order Completed")
            letters = await api.call("GET", "/ops/dead-letters", otto)
            assert letters.status == 200, letters
            depths = await api.call("GET", "/ops/stats", otto)
            assert depths.status == 200 and all(
                n is not None for n in depths.body["queues"].values()
            ), depths.body
        finally:
            await api.close()

        outputs = "".join(r.stdout + r.stderr for r in (submitted, dead, stats, refused_dlq))
        _no_secrets(topo, broker.passwords, outputs)


# -- PostgreSQL: the postgres profile's init script, run against the real server


async def test_the_postgres_init_script_makes_an_owner_of_its_database_and_nothing_more(
    hub: str,
) -> None:
    if shutil.which("psql") is None:
        service_missing("psql (to run infra/postgres/init-app-user.sh)", "not on PATH")
    server = urlsplit(POSTGRES_URL)
    role, database, password = f"{hub}_app", f"{hub}_db", secrets.token_hex(16)
    env = os.environ | {
        "PGHOST": server.hostname or "127.0.0.1",
        "PGPORT": str(server.port or 5432),
        "POSTGRES_USER": server.username or "postgres",
        "POSTGRES_APP_USER": role,
        "POSTGRES_APP_DB": database,
        "POSTGRES_APP_PASSWORD": password,
        # The shared server's other databases stay open to PUBLIC (test_postgres_role.py shows
        # the revocation on a private server).
        "POSTGRES_KEEP_PUBLIC_CONNECT": "1",
    }
    superuser = await asyncpg.connect(POSTGRES_URL)
    try:
        done = subprocess.run(
            ["sh", str(ROOT / "infra" / "postgres" / "init-app-user.sh")],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        assert password not in done.stdout + done.stderr
        flags = await superuser.fetchrow(
            "SELECT rolsuper, rolcreatedb, rolcreaterole, rolpassword IS NOT NULL AS has_password"
            " FROM pg_authid WHERE rolname = $1",
            role,
        )
        assert dict(flags) == {
            "rolsuper": False,
            "rolcreatedb": False,
            "rolcreaterole": False,
            "has_password": True,
        }
        owner = await superuser.fetchval(
            "SELECT pg_get_userbyid(datdba) FROM pg_database WHERE datname = $1", database
        )
        assert owner == role
        # As the application: the store initialises its schema and works; nothing beyond.
        app_url = f"postgresql://{role}:{password}@{env['PGHOST']}:{env['PGPORT']}/{database}"
        store = await PostgresStore.connect(
            app_url, "orderflow", pool_size=1, timeout=5, command_timeout=10
        )
        try:
            await store.init()
            await store.ping()
        finally:
            await store.close()
        app = await asyncpg.connect(app_url)
        try:
            for statement in (f"CREATE ROLE {hub}_other", f"CREATE DATABASE {hub}_other"):
                with pytest.raises(asyncpg.InsufficientPrivilegeError):
                    await app.execute(statement)
        finally:
            await app.close()
    finally:
        await superuser.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
        await superuser.execute(f'DROP ROLE IF EXISTS "{role}"')
        await superuser.close()


def _dropped(reason: str) -> float:
    return REGISTRY.get_sample_value("orderflow_replies_dropped_total", {"reason": reason}) or 0.0


async def test_no_agent_can_answer_for_another_and_no_reply_for_another_request_counts(
    broker: Broker,
) -> None:
    """The inventory agent's user delivered a "charge ok" into a scheduler's reply queue, and
    the scheduler took it (matched on a guessable correlation id alone). Now: a random
    correlation id per request, and even with it (the worst case: the attacker saw it) a reply
    from the wrong agent, or about another attempt, is dropped and counted; the true one is
    taken."""
    n = Names(broker.hub)
    scheduler = await broker.port("scheduler")
    inventory, payment = (
        await broker.port("agent-inventory"),
        await broker.port("agent-payment"),
    )
    senders = Senders.of(n.hub, None, broker.user("scheduler"), "scheduler")
    assert senders.strict
    router = ReplyRouter(senders)
    replies = PrivateQueue(scheduler, n.reply_queue("scheduler-t"), router.deliver, max_bytes=65536)
    await replies.start()
    try:
        correlation_id = "0f" * 16
        expected = Expected(
            sender_role="agent-payment",
            order_id="o-1",
            step="payment",
            action=StepAction.DO,
            fencing_token="o-1:1",
            idempotency_key="o-1:payment",
        )
        waiting = router.expect(correlation_id, expected)
        ok = StepReply(
            order_id="o-1",
            step="payment",
            action=StepAction.DO,
            fencing_token="o-1:1",
            idempotency_key="o-1:payment",
            outcome=StepOutcome.OK,
            attempts_used=1,
            result={"charge_id": "ch_forged"},
        )
        before = {r: _dropped(r) for r in ("unauthorised", "mismatch", "unknown")}

        async def reply_as(connection: Connection, reply: StepReply) -> None:
            publisher = await Publisher.open(connection, timeout=5)
            try:
                await publisher.publish(
                    reply,
                    exchange=n.replies,
                    routing_key=replies.name,
                    message_id=uuid.uuid4().hex,
                    correlation_id=correlation_id,
                )
            finally:
                await publisher.close()

        await reply_as(inventory, ok)  # another agent's forgery
        await reply_as(payment, ok.model_copy(update={"fencing_token": "o-1:0"}))  # stale
        await reply_as(payment, ok.model_copy(update={"step": "shipping"}))  # another step

        async def counted() -> bool:
            return (
                _dropped("unauthorised") >= before["unauthorised"] + 1
                and _dropped("mismatch") >= before["mismatch"] + 2
            )

        await eventually(counted, what="the forged and stale replies dropped")
        assert not waiting.done()
        await reply_as(payment, ok)
        assert await asyncio.wait_for(waiting, timeout=10) == ok
    finally:
        await replies.stop()
        for connection in (scheduler, inventory, payment):
            await connection.close()


@dataclass
class Attack:
    """What the attacks of one run share: the system, and connections as each user."""

    topo: Topology
    broker: Broker
    conns: dict[str, aio_pika.abc.AbstractConnection]
    pubs: dict[str, Publisher]

    @property
    def names(self) -> Names:
        return Names(self.broker.hub)

    async def submit(self, app: str, order: Any, reply_to: str | None = None) -> None:
        n = self.names
        await self.pubs[app].publish(
            SubmitOrder(order=order, reply_to=reply_to),
            exchange=n.submit,
            routing_key=n.orders,
            message_id=f"order:{order.order_id}:{order.fingerprint()[:16]}",
        )


async def _tenants_are_apart(attack: Attack) -> None:
    topo, broker, conns, n = attack.topo, attack.broker, attack.conns, attack.names
    app_a, app_b = broker.apps
    submit = attack.submit
    # B's status queue, for its own orders (submission declares and binds it when B names it).
    b_name = n.status_queue(app_b)
    # 1. Order ids are each application's own: A takes "o-same" first, and B's
    # "o-same" is B's order, not a conflict. B follows its order; A names B's status
    # queue for its own order, and B hears nothing of it.
    await submit(app_a, order_data("o-same", customer_id="c-a"), reply_to=b_name)
    await submit(app_b, order_data("o-same", customer_id="c-b"), reply_to=b_name)
    await topo.wait_settled(2, timeout=90)
    b_statuses = await (await conns[app_b].channel()).get_queue(b_name, ensure=True)
    for app, customer in ((app_a, "c-a"), (app_b, "c-b")):
        record = await topo.store.get_order(f"{app}/o-same")
        assert record is not None and record.data.customer_id == customer
        state = await topo.store.get_state(f"{app}/o-same")
        assert state is not None and state.process_state is ProcessState.PROCESSED
    a_state = await topo.store.get_state(f"{app_a}/o-same")
    assert a_state is not None and a_state.reply_to is None  # B's queue refused for A
    statuses: list[OrderStatusUpdate] = []
    while (m := await b_statuses.get(no_ack=True, fail=False)) is not None:
        statuses.append(OrderStatusUpdate.model_validate_json(m.body))
        assert m.user_id in {broker.user(r) for r in ("submission", "scheduler")}
    assert {s.status for s in statuses} >= {OrderStatus.RECEIVED, OrderStatus.COMPLETED}
    assert {s.order_id for s in statuses} == {"o-same"}  # B's own id, B's order only
    assert len(statuses) == 3  # Received, Processing, Completed: none of A's


async def _only_the_allowed_may_send(attack: Attack) -> None:
    topo, broker, conns, pubs, n = (
        attack.topo,
        attack.broker,
        attack.conns,
        attack.pubs,
        attack.names,
    )
    app_a = broker.apps[0]
    # 2. Who may send to the orders queue: applications only, with a user_id.
    await pubs["scheduler"].publish(  # a scheduler's user, through the direct exchange
        SubmitOrder(order=order_data("o-by-scheduler")),
        exchange=n.exchange,
        routing_key=n.orders,
        message_id="order:o-by-scheduler",
    )
    channel = await conns[app_a].channel()
    submit_exchange = await channel.get_exchange(n.submit, ensure=False)
    await submit_exchange.publish(  # no user_id: below our publisher
        aio_pika.Message(
            SubmitOrder(order=order_data("o-anonymous")).to_json(),
            message_id="order:o-anonymous",
            type="order.submit",
        ),
        routing_key=n.orders,
    )
    # 3. The operator may replay, not command: a step request of its own making, sent
    # through the payment queue's replay exchange, and a forged seal on an order.
    forged = Outgoing(
        StepRequest(
            order_id=f"{app_a}/o-same",
            step="payment",
            action=StepAction.UNDO,
            operation="payment.refund",
            fencing_token=f"{app_a}/o-same:1",
            idempotency_key=f"{app_a}/o-same:payment:undo",
            complete_by=utcnow() + timedelta(minutes=5),
            attempts_allowed=1,
            reply_to=n.reply_queue("x"),
        ).to_json(),
        message_id="forged-refund",
        type="step.request",
        headers={SENDER: broker.user("scheduler"), SEAL: "00" * 32},
    )
    await pubs["operator"].publish_raw(
        forged, exchange=n.replay(n.agent("payment")), routing_key=""
    )
    await pubs["operator"].publish_raw(
        Outgoing(
            SubmitOrder(order=order_data("o-by-operator")).to_json(),
            message_id="order:o-by-operator",
            type="order.submit",
            headers={SENDER: app_a},
        ),
        exchange=n.replay(n.orders),
        routing_key="",
    )

    async def refused_all() -> dict[str, Any] | None:
        got = await take_dead_letters(conns["operator"], n.orders)
        got += await take_dead_letters(conns["operator"], n.agent("payment"))
        seen.update({str(m.message_id): m for m in got})
        wanted = {"order:o-by-scheduler", "order:o-anonymous", "forged-refund"}
        return seen if wanted | {"order:o-by-operator"} <= set(seen) else None

    seen: dict[str, Any] = {}
    await eventually(refused_all, timeout=30, what="every forgery dead-lettered")
    for message_id in (
        "order:o-by-scheduler",
        "order:o-anonymous",
        "forged-refund",
        "order:o-by-operator",
    ):
        dead = seen[message_id]
        assert dead.headers[REASON] == "unauthorised", (message_id, dead.headers)
        assert SEAL not in dead.headers or dead.headers.get(SENDER) != app_a
    for order_id in ("o-by-scheduler", "o-anonymous", "o-by-operator"):
        for owner in ("", f"{app_a}/", f"{broker.user('scheduler')}/"):
            assert await topo.store.get_order(owner + order_id) is None
    undos = await topo.store.read_compensation(f"{app_a}/o-same")
    # The completed steps' undos are noted as ever; the forged refund ran none of them.
    assert undos and all(u.done_at is None and u.error is None for u in undos)


async def _only_sealed_replays_are_taken(attack: Attack) -> None:
    topo, broker, conns, pubs, n = (
        attack.topo,
        attack.broker,
        attack.conns,
        attack.pubs,
        attack.names,
    )
    app_a = broker.apps[0]
    submit = attack.submit
    # 4. A replay of what the system dead-lettered is accepted as its sender's: A resubmits
    # "o-same" changed (a conflict, sealed with A as its sender); `dlq replay` as the operator
    # brings it back a conflict again, not unauthorised; a replay whose body the operator
    # changed is refused; and a dead letter without a seal is not replayed at all.
    await submit(app_a, order_data("o-same", customer_id="c-changed"))
    operator = {"ORDERFLOW_RABBITMQ_URL": broker.url("operator")}

    async def listed() -> list[dict[str, Any]]:
        answer = topo.cli("dlq", "list", "--queue", "orders", "--json", **operator)
        assert answer.returncode == 0, answer.stderr
        return list(json.loads(answer.stdout)["messages"])

    async def conflict() -> bool:
        return [m["reason"] for m in await listed()] == ["conflict"]

    await eventually(conflict, timeout=30, what="the conflict dead-lettered")
    replayed = topo.cli("dlq", "replay", "--all", "--queue", "orders", **operator)
    assert replayed.returncode == 0 and "1 replayed" in replayed.stdout, replayed.stderr
    dead = (await eventually(lambda: take_dead_letters(conns["operator"], n.orders), timeout=30))[0]
    assert dead.headers[REASON] == "conflict", dead.headers  # taken as A's, refused as before
    assert dead.headers[SENDER] == app_a and SEAL in dead.headers
    tampered = Outgoing(
        dead.body.replace(b"c-changed", b"c-evil"),
        message_id=dead.message_id,
        type=dead.type,
        headers={k: dead.headers[k] for k in (SENDER, SEAL)},
        correlation_id=dead.correlation_id,
        reply_to=dead.reply_to,
    )
    await pubs["operator"].publish_raw(tampered, exchange=n.replay(n.orders), routing_key="")
    again = await eventually(lambda: take_dead_letters(conns["operator"], n.orders), timeout=30)
    assert [m.headers[REASON] for m in again] == ["unauthorised"]

    channel = await conns[app_a].channel()
    anonymous = aio_pika.Message(b"{}", message_id="anonymous", type="order.submit")
    await (await channel.get_exchange(n.submit, ensure=False)).publish(anonymous, n.orders)
    await eventually(listed, timeout=30, what="the anonymous message dead-lettered")
    kept = topo.cli("dlq", "replay", "anonymous", **operator)
    assert kept.returncode == 1 and "no seal" in kept.stderr, kept.stdout + kept.stderr
    assert [m["message_id"] for m in await listed()] == ["anonymous"]  # left where it was
    state = await topo.store.get_order(f"{app_a}/o-same")
    assert state is not None and state.data.customer_id == "c-a"  # nothing overwritten


async def _what_a_review_found_next_is_closed(attack: Attack) -> None:
    """A second review's attacks: a status queue that dead-letters into the orders queue, a
    shop holding a seal key, and one shop taking another's message ids first."""
    topo, broker, conns, pubs, n = (
        attack.topo,
        attack.broker,
        attack.conns,
        attack.pubs,
        attack.names,
    )
    app_a, app_b = broker.apps
    # 5. A status queue of A's that dead-letters every message at once into `submit`: A may
    # declare no queue, and submission declares the one A names as a status queue is, so no
    # status loops.
    looping = n.status_queue(app_a)
    channel = await conns[app_a].channel()
    await refused(
        lambda: channel.declare_queue(
            looping,
            durable=True,
            arguments={"x-dead-letter-exchange": n.submit, "x-message-ttl": 0},
        )
    )
    await attack.submit(app_a, order_data("o-loop"), reply_to=looping)
    # 6. B takes the message id A's next order will have: A's order is not a duplicate.
    mine = order_data("o-mine")
    taken = f"order:{mine.order_id}:{mine.fingerprint()[:16]}"
    await pubs[app_b].publish(
        SubmitOrder(order=order_data("o-decoy")),
        exchange=n.submit,
        routing_key=n.orders,
        message_id=taken,
    )
    await attack.submit(app_a, mine)
    # 7. A shop that got hold of submission's seal key seals a message as B's: only the
    # operator's replays are taken with a seal.
    key = seal_key(load_settings(rabbitmq_url=broker.url("submission")).broker)
    assert key is not None
    body = SubmitOrder(order=order_data("o-as-b")).to_json()
    forged_seal = Sealed(
        queue=n.orders,
        sender=app_b,
        message_id="order:o-as-b",
        message_type="order.submit",
        correlation_id=None,
        reply_to=None,
        body=body,
    ).seal(key)
    await pubs[app_a].publish_raw(
        Outgoing(
            body,
            message_id="order:o-as-b",
            type="order.submit",
            headers={SENDER: app_b, SEAL: forged_seal},
        ),
        exchange=n.submit,
        routing_key=n.orders,
    )

    async def settled() -> bool:
        states = [
            await topo.store.get_state(f"{app}/{o}")
            for app, o in ((app_a, "o-loop"), (app_a, "o-mine"), (app_b, "o-decoy"))
        ]
        return all(s is not None and s.process_state is ProcessState.PROCESSED for s in states)

    await eventually(settled, timeout=60, what="the orders behind the attacks Processed")

    taken: list[Any] = []

    async def forgery() -> Any:
        taken.extend(await take_dead_letters(conns["operator"], n.orders))
        return next((m for m in taken if m.message_id == "order:o-as-b"), None)

    dead = await eventually(forgery, timeout=30, what="the sealed forgery dead-lettered")
    assert dead.headers[REASON] == "unauthorised"
    assert "only the operator replays" in str(dead.headers["x-orderflow-error"])
    assert await topo.store.get_order(f"{app_b}/o-as-b") is None
    underlay = await (await conns[app_a].channel()).get_underlay_channel()
    declared = await underlay.queue_declare(looping, passive=True)
    assert declared.message_count >= 3  # a status queue: Received .. Completed, kept for A
    assert not [m for m in taken if m.type == "order.status"]  # no status looped in


async def test_every_forgery_planting_and_cross_application_read_is_refused(
    broker: Broker, tmp_path: Path
) -> None:
    """The attacks of the security review, each as the user that tried it, against the real
    processes each under its own user: each refused, nothing changed, and the audit clean."""
    app_a, app_b = broker.apps
    async with running_topology(
        broker.hub, tmp_path, ORDERFLOW_RABBITMQ_URL=broker.url("admin")
    ) as topo:
        serve_each_under_its_own_user(topo, broker)
        await topo.wait_remote()
        conns = {r: await broker.connect(r) for r in (app_a, app_b, "scheduler", "operator")}
        # The publishers are the runtime's, on port connections as the same users.
        ports = {r: await broker.port(r) for r in conns}
        try:
            pubs = {r: await Publisher.open(c, timeout=5) for r, c in ports.items()}

            attack = Attack(topo, broker, conns, pubs)
            await _tenants_are_apart(attack)
            await _only_the_allowed_may_send(attack)
            await _only_sealed_replays_are_taken(attack)
            await _what_a_review_found_next_is_closed(attack)
            # One poison alert per reason and queue in the window, not one per message.
            alerts = [a for a in await topo.store.list_alerts() if "unauthorised" in a.message]
            assert 1 <= len(alerts) <= 2, [a.message for a in alerts]
            for publisher in pubs.values():
                await publisher.close()
        finally:
            for connection in conns.values():
                await connection.close()
            for port in ports.values():
                await port.close()
        audit = await topo.audit()
        assert audit["ok"], audit
        _no_secrets(topo, broker.passwords)
