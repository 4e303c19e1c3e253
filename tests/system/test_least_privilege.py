"""Least privilege on the real RabbitMQ: the generated definitions, loaded into a vhost of this
test's own, let each user do what its service does and refuse the rest; and the real processes,
each under its own user, take orders to Processed without a password in their logs. Last, the
postgres profile's init script against the real PostgreSQL.

The definitions go through the same path as in the compose deployment: generated with password
placeholders, rendered by `infra/rabbitmq/render-definitions.sh` (the shell script computes the
hashes), imported with `rabbitmqctl import_definitions`. The vhost and the users are deleted
afterwards, also on failure.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import aio_pika
import aiormq
import asyncpg
import pytest

from services.deploy.rabbitmq import definitions, password_variable, render
from shared.broker.access import SERVICE_ROLES
from shared.broker.topology import Names, QueuePolicy, declare_topology
from shared.config import load_settings
from shared.domain.states import ProcessState
from shared.store.postgres import PostgresStore
from tests.conftest import POSTGRES_URL, service_missing
from tests.support.topology import Topology, free_port, running_topology
from tests.support.waiting import eventually

pytestmark = [pytest.mark.rabbitmq, pytest.mark.postgres]

ROOT = Path(__file__).resolve().parents[2]
RENDER = ROOT / "infra" / "rabbitmq" / "render-definitions.sh"
AMQP_HOST = os.environ.get("ORDERFLOW_TEST_RABBITMQ_HOST", "127.0.0.1:5672")


def rabbitmqctl(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["rabbitmqctl", *args], capture_output=True, text=True, timeout=60, check=check
    )


@dataclass
class Broker:
    hub: str
    vhost: str
    apps: tuple[str, str]
    passwords: dict[str, str]
    """Password variable -> password."""

    def user(self, role: str) -> str:
        return role if role in self.apps else f"{self.hub}-{role}"

    def url(self, role: str) -> str:
        variable = password_variable(role, app=role in self.apps)
        return f"amqp://{self.user(role)}:{self.passwords[variable]}@{AMQP_HOST}/{self.vhost}"

    async def connect(self, role: str) -> aio_pika.abc.AbstractConnection:
        return await aio_pika.connect(self.url(role), timeout=5)


def _import(text: str, passwords: dict[str, str]) -> None:
    # The broker reads the file as its own OS user: a world-readable directory, removed at once
    # (the rendered file holds salted hashes, never a password).
    folder = Path(tempfile.mkdtemp(prefix="orderflow-definitions-"))
    try:
        folder.chmod(0o755)
        template, rendered = folder / "template.json", folder / "definitions.json"
        template.write_text(text)
        done = subprocess.run(
            ["sh", str(RENDER), str(template), str(rendered)],
            env=os.environ | passwords,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        assert not any(p in rendered.read_text() for p in passwords.values())
        rendered.chmod(0o644)
        rabbitmqctl("import_definitions", str(rendered))
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
async def broker(hub: str) -> AsyncIterator[Broker]:
    if shutil.which("rabbitmqctl") is None:
        service_missing("rabbitmqctl (to import definitions)", "not on PATH")
    probe = subprocess.run(["rabbitmqctl", "-q", "status"], capture_output=True, timeout=60)
    if probe.returncode != 0:
        service_missing("rabbitmqctl (to import definitions)", probe.stderr.decode()[-300:])
    apps = (f"{hub}-a", f"{hub}-b")
    text = render(definitions(hub, hub, apps=apps))
    passwords = {password_variable(role): secrets.token_hex(16) for role in SERVICE_ROLES} | {
        password_variable(app, app=True): secrets.token_hex(16) for app in apps
    }
    b = Broker(hub, hub, apps, passwords)
    try:
        _import(text, passwords)

        async def can_log_in() -> bool:
            try:
                connection = await b.connect("admin")
            except Exception:
                return False
            await connection.close()
            return True

        # The import is asynchronous.
        await eventually(can_log_in, timeout=30, interval=0.2, what="the imported admin user")
        admin = await b.connect("admin")
        try:
            settings = load_settings()  # the policy `orderflow init` declares with
            policy = QueuePolicy(
                quorum=True,
                delivery_limit=settings.redelivery_limit,
                orders_max_length=settings.orders_queue_max_length,
            )
            await declare_topology(await admin.channel(), Names(hub), policy)
        finally:
            await admin.close()
        yield b
    finally:
        rabbitmqctl("delete_vhost", b.vhost, check=False)
        for role in (*SERVICE_ROLES, *apps):
            rabbitmqctl("delete_user", b.user(role), check=False)


async def refused(action: Callable[[], Awaitable[object]]) -> str:
    """Run `action`; it must be refused by the broker's permissions. Returns the refusal."""
    try:
        await action()
    except aiormq.exceptions.ChannelAccessRefused as exc:
        return str(exc)
    raise AssertionError("the broker allowed it")


async def publish(
    connection: aio_pika.abc.AbstractConnection, exchange: str, routing_key: str
) -> object:
    channel = await connection.channel(publisher_confirms=True)
    target = (
        channel.default_exchange
        if exchange == ""
        else await channel.get_exchange(exchange, ensure=False)
    )
    return await target.publish(
        aio_pika.Message(b"{}", message_id="m-1"), routing_key, mandatory=False, timeout=5
    )


async def _ignore(_: aio_pika.abc.AbstractIncomingMessage) -> None:
    return None


async def consume(connection: aio_pika.abc.AbstractConnection, queue: str) -> str:
    channel = await connection.channel()
    declared = await channel.get_queue(queue, ensure=True)  # passive: needs no permission
    return await declared.consume(_ignore)


async def declare(connection: aio_pika.abc.AbstractConnection, queue: str) -> object:
    channel = await connection.channel()
    return await channel.declare_queue(queue, auto_delete=True)


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
        # ... and follows its orders on its own status queues, never another application's.
        own = await (await app.channel()).declare_queue(n.status_queue(app_a), exclusive=True)
        await own.bind(n.status, routing_key=own.name)
        other = n.status_queue(app_b)
        await refused(lambda: declare(app, other))
        assert "topic" in await refused(lambda: own.bind(n.status, routing_key=other))
        b_queue = await (await conns[app_b].channel()).declare_queue(
            f"{n.status_prefix(app_b)}kept", auto_delete=True
        )
        assert b_queue.name in await refused(lambda: consume(app, b_queue.name))

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

        # The operator reads and replays dead letters, and takes no live message.
        channel = await conns["operator"].channel()
        await (await channel.get_queue(n.dlq(n.orders), ensure=True)).get(fail=False)
        await publish(conns["operator"], n.exchange, n.orders)
        await refused(lambda: consume(conns["operator"], n.orders))
        await refused(lambda: declare(conns["operator"], f"{n.hub}.mine"))
    finally:
        for connection in conns.values():
            await connection.close()


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
