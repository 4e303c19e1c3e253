"""A RabbitMQ vhost of a test's own, loaded with the generated definitions, and connections as
each of its users: what the least-privilege, limits and attack tests run against.

The definitions go through the same path as in the compose deployment: generated with password
placeholders, rendered by `infra/rabbitmq/render-definitions.sh` (the shell script computes the
hashes), imported with `rabbitmqctl import_definitions`. The vhost and its users are deleted
afterwards, also on failure.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aio_pika
import aiormq

from deployment.rabbitmq import BrokerLimits, definitions, password_variable, render
from shared.broker.access import SERVICE_ROLES
from shared.broker.port import BrokerRefused
from shared.broker.rabbitmq import RabbitConnection
from shared.broker.rabbitmq import connect as connect_port
from shared.broker.topology import Names, QueuePolicy, declare_topology
from shared.config import load_settings
from tests.conftest import service_missing
from tests.support.topology import Topology
from tests.support.waiting import eventually

ROOT = Path(__file__).resolve().parents[2]
RENDER = ROOT / "infra" / "rabbitmq" / "render-definitions.sh"
AMQP_HOST = os.environ.get("ORDERFLOW_TEST_RABBITMQ_HOST", "127.0.0.1:5672")


def rabbitmqctl(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["rabbitmqctl", *args], capture_output=True, text=True, timeout=60, check=check
    )


@dataclass
class Broker:
    """A scratch vhost (named as the hub) with the generated users: the services' (`<hub>-<role>`)
    and the applications' (named as themselves)."""

    hub: str
    vhost: str
    apps: tuple[str, ...]
    passwords: dict[str, str]
    """Password variable -> password."""

    def user(self, role: str) -> str:
        return role if role in self.apps else f"{self.hub}-{role}"

    def url(self, role: str) -> str:
        variable = password_variable(role, app=role in self.apps)
        return f"amqp://{self.user(role)}:{self.passwords[variable]}@{AMQP_HOST}/{self.vhost}"

    async def connect(self, role: str) -> aio_pika.abc.AbstractConnection:
        """A raw aio-pika connection as `role`, to poke the broker directly."""
        return await aio_pika.connect(self.url(role), timeout=5)

    async def port(self, role: str) -> RabbitConnection:
        """A broker port connection as `role`, as the runtime code takes."""
        return await connect_port(self.url(role), timeout=5, name=f"tests-{role}")


def import_definitions(text: str, passwords: dict[str, str]) -> None:
    """Render the definitions' placeholders with `passwords` and import them."""
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


def _require_rabbitmqctl() -> None:
    if shutil.which("rabbitmqctl") is None:
        service_missing("rabbitmqctl (to import definitions)", "not on PATH")
    probe = subprocess.run(["rabbitmqctl", "-q", "status"], capture_output=True, timeout=60)
    if probe.returncode != 0:
        service_missing("rabbitmqctl (to import definitions)", probe.stderr.decode()[-300:])


@asynccontextmanager
async def scratch_vhost(
    hub: str,
    *,
    apps: tuple[str, ...] | None = None,
    limits: BrokerLimits | None = None,
    topology: bool = True,
) -> AsyncIterator[Broker]:
    """The generated definitions of `hub` (applications `apps`, default `<hub>-a` and
    `<hub>-b`) imported into a vhost named `hub`; with `topology`, the hub's queues and
    exchanges declared as `orderflow init` declares them, as its admin user."""
    _require_rabbitmqctl()
    apps = apps if apps is not None else (f"{hub}-a", f"{hub}-b")
    text = render(definitions(hub, hub, apps=apps, limits=limits))
    passwords = {password_variable(role): secrets.token_hex(16) for role in SERVICE_ROLES} | {
        password_variable(app, app=True): secrets.token_hex(16) for app in apps
    }
    broker = Broker(hub, hub, apps, passwords)
    try:
        import_definitions(text, passwords)

        async def can_log_in() -> bool:
            try:
                connection = await broker.connect(apps[0] if apps else "admin")
            except Exception:
                return False
            await connection.close()
            return True

        # The import is asynchronous.
        await eventually(can_log_in, timeout=30, interval=0.2, what="the imported users")
        if topology:
            admin = await broker.port("admin")
            try:
                settings = load_settings()  # the policy `orderflow init` declares with
                policy = QueuePolicy(
                    quorum=True,
                    delivery_limit=settings.broker.redelivery_limit,
                    orders_max_length=settings.broker.orders_queue_max_length,
                )
                declaring = await admin.admin()
                try:
                    await declare_topology(declaring, Names(hub), policy)
                finally:
                    await declaring.close()
            finally:
                await admin.close()
        yield broker
    finally:
        rabbitmqctl("delete_vhost", broker.vhost, check=False)
        for role in (*SERVICE_ROLES, *apps):
            rabbitmqctl("delete_user", broker.user(role), check=False)


async def refused(action: Callable[[], Awaitable[object]]) -> str:
    """Run `action`; it must be refused by the broker's permissions. Returns the refusal.
    Raw aio-pika calls raise aiormq's `ChannelAccessRefused`; through the port, the adapter
    maps exactly that refusal to `BrokerRefused` (not to its subclasses, which are others)."""
    try:
        await action()
    except aiormq.exceptions.ChannelAccessRefused as exc:
        return str(exc)
    except BrokerRefused as exc:
        if type(exc) is not BrokerRefused:
            raise
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


async def bind_exchanges(
    connection: aio_pika.abc.AbstractConnection, *, destination: str, source: str
) -> object:
    channel = await connection.channel()
    target = await channel.get_exchange(destination, ensure=False)
    return await target.bind(source, routing_key="#")


def serve_each_under_its_own_user(topo: Topology, broker: Broker) -> None:
    """The core processes of `topo`, each under its own broker user (the remote service under
    none: it needs no broker)."""
    topo.serve("remote", "remote", ORDERFLOW_RABBITMQ_URL=f"amqp://nobody@{AMQP_HOST}/none")
    for label, args, role in [
        ("submission", ["submission"], "submission"),
        ("scheduler-1", ["scheduler"], "scheduler"),
        ("supervisor-1", ["supervisor"], "supervisor"),
        *((name, ["agent", name], f"agent-{name}") for name in ("inventory", "payment")),
        ("shipping", ["agent", "shipping"], "agent-shipping"),
    ]:
        topo.serve(label, *args, ORDERFLOW_RABBITMQ_URL=broker.url(role))


async def take_dead_letters(connection: aio_pika.abc.AbstractConnection, queue: str) -> list[Any]:
    """The messages of `queue`'s DLQ, taken off it (the operator's read)."""
    channel = await connection.channel()
    dlq = await channel.get_queue(Names.dlq(queue), ensure=True)
    got = []
    while (message := await dlq.get(no_ack=True, fail=False)) is not None:
        got.append(message)
    await channel.close()
    return got
