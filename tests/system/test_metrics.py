"""Metrics, heartbeats and the runtime alerts, read from real processes (issue 5)."""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import aio_pika
import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from shared.broker.rabbitmq.connection import connect
from shared.domain.coordination import ComponentStatus
from shared.domain.journal import Alert, AlertKind
from shared.domain.states import ProcessState
from shared.domain.timing import utcnow
from tests.conftest import RABBITMQ_URL, RABBITMQ_USER
from tests.support.topology import Topology, free_port, running_topology
from tests.support.waiting import eventually

pytestmark = [pytest.mark.rabbitmq, pytest.mark.postgres]

AGENTS = ("inventory", "payment", "shipping")
STEPS = ("reserve", "charge", "ship")
PROCESSES = {
    "remote": ["remote"],
    "submission": ["submission"],
    "scheduler-1": ["scheduler"],
    "supervisor-1": ["supervisor"],
    **{agent: ["agent", agent] for agent in AGENTS},
}
KINDS = {
    "submission": "submission",
    "scheduler-1": "scheduler",
    "supervisor-1": "supervisor",
    **{agent: f"agent-{agent}" for agent in AGENTS},
}
"""Every process that reports a status (the remote service has no store)."""

Samples = list[tuple[str, dict[str, str], float]]


@pytest.fixture
async def topo(hub: str, tmp_path: Path) -> AsyncIterator[Topology]:
    async with running_topology(hub, tmp_path, ORDERFLOW_HEARTBEAT_S="0.3") as t:
        yield t


async def start_with_metrics(topo: Topology) -> dict[str, int]:
    """Start every process, each with a metrics port of its own."""
    ports: dict[str, int] = {}
    for label in PROCESSES:
        while (port := free_port()) in ports.values():
            pass  # the system may hand out a port it just handed out
        ports[label] = port
    for label, port in ports.items():
        topo.serve(label, *PROCESSES[label], ORDERFLOW_METRICS_PORT=str(port))
    await topo.wait_remote()
    return ports


async def scrape(port: int) -> Samples:
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session,
        session.get(f"http://127.0.0.1:{port}/metrics") as response,
    ):
        assert response.status == 200
        assert response.content_type == "text/plain"
        text = await response.text()
    return [
        (s.name, dict(s.labels), s.value)
        for family in text_string_to_metric_families(text)
        for s in family.samples
    ]


async def scraped(port: int) -> Samples:
    """The samples once the process serves them (it starts serving once it is connected)."""

    async def probe() -> Samples | None:
        try:
            return await scrape(port)
        except aiohttp.ClientConnectionError:
            return None

    return await eventually(probe, timeout=20, interval=0.1, what=f"metrics on port {port}")


def value(samples: Samples, name: str, **labels: str) -> float:
    """The sum of the samples of `name` whose labels include `labels` (0 when there are none)."""
    return sum(v for n, ls, v in samples if n == name and labels.items() <= ls.items())


async def metric_reaches(
    port: int, name: str, wanted: float, *, at_least: bool = False, **labels: str
) -> Samples:
    """The samples once `name` (summed over `labels`) is `wanted`, or at least `wanted`."""

    async def probe() -> Samples | None:
        got = value(samples := await scraped(port), name, **labels)
        return samples if got == wanted or (at_least and got > wanted) else None

    return await eventually(probe, timeout=15, interval=0.1, what=f"{name}{labels} == {wanted}")


def submit(topo: Topology, *args: str) -> dict:
    result = topo.cli("submit", "--json", *args)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


async def test_every_process_serves_metrics_with_real_values(topo: Topology) -> None:
    ports = await start_with_metrics(topo)
    assert submit(topo, "--count", "20", "--seed", "11")["published"] == 20
    counts = await topo.wait_settled(20, timeout=60)
    assert counts[ProcessState.PROCESSED] == 20

    scheduler = await scraped(ports["scheduler-1"])
    assert value(scheduler, "orderflow_claims_total", kind="forward") >= 20
    assert value(scheduler, "orderflow_claims_total", kind="compensation") == 0
    for step in STEPS:
        assert value(scheduler, "orderflow_step_seconds_count", step=step, action="do") >= 20
        assert value(scheduler, "orderflow_step_seconds_sum", step=step, action="do") > 0
        ok = value(scheduler, "orderflow_step_outcomes_total", step=step, outcome="ok")
        assert ok >= 20, step
        assert value(scheduler, "orderflow_step_outcomes_total", step=step, outcome="deadline") == 0
    await metric_reaches(ports["scheduler-1"], "orderflow_inflight", 0)

    for agent in AGENTS:
        # A request counts as handled once its reply is out and its inbox entry done: the
        # last one may be counted just after its order was recorded Processed.
        queue = f"{topo.hub}.agent.{agent}"
        samples = await metric_reaches(
            ports[agent],
            "orderflow_messages_total",
            20,
            at_least=True,
            queue=queue,
            outcome="handled",
        )
        assert value(samples, "orderflow_agent_attempts_total", agent=agent, outcome="ok") >= 20
        assert value(samples, "orderflow_agent_attempts_total", outcome="transient") == 0
        circuits = [ls for n, ls, _ in samples if n == "orderflow_circuit_state"]
        assert circuits and all(ls["operation"].startswith(f"{agent}.") for ls in circuits)
        assert value(samples, "orderflow_circuit_state") == 0, "every circuit closed"

    orders = f"{topo.hub}.orders"
    await metric_reaches(
        ports["submission"], "orderflow_messages_total", 20, queue=orders, outcome="handled"
    )

    supervisor = await metric_reaches(
        ports["supervisor-1"], "orderflow_orders", 20, state="Processed"
    )
    assert value(supervisor, "orderflow_orders") == 20, "every other state is 0"
    assert value(supervisor, "orderflow_supervisor_leader") == 1
    assert value(supervisor, "orderflow_queue_depth", queue=orders) == 0
    assert value(supervisor, "orderflow_queue_depth", queue=f"{orders}.dlq") == 0
    assert value(supervisor, "orderflow_supervisor_recoveries_total") == 0

    remote = await scraped(ports["remote"])
    assert value(remote, "process_cpu_seconds_total") > 0

    # The first order of the same seed again: the same message id, handled again and found
    # recorded (the orders queue is deduped by its records, decision:orders-deduped-by-order).
    assert submit(topo, "--count", "1", "--seed", "11")["published"] == 1
    submission = await metric_reaches(
        ports["submission"], "orderflow_messages_total", 21, queue=orders, outcome="handled"
    )
    assert value(submission, "orderflow_messages_total", queue=orders, outcome="duplicate") == 0
    # Poison input is dead-lettered with its reason, and the depth of the dead letters shows.
    connection = await connect(RABBITMQ_URL, timeout=5, name="metrics-test")
    try:
        channel = await connection.channel()
        poison = aio_pika.Message(
            b"{not json", message_id="poison-1", type="order.submit", user_id=RABBITMQ_USER
        )
        await channel.default_exchange.publish(poison, routing_key=orders)
    finally:
        await connection.close()
    submission = await metric_reaches(
        ports["submission"], "orderflow_dead_letters_total", 1, queue=orders, reason="malformed"
    )
    assert value(submission, "orderflow_messages_total", queue=orders, outcome="dead_lettered") == 1
    await metric_reaches(ports["supervisor-1"], "orderflow_queue_depth", 1, queue=f"{orders}.dlq")
    assert (await topo.counts())[ProcessState.PROCESSED] == 20


async def statuses(topo: Topology) -> dict[str, ComponentStatus]:
    prefix = f"{topo.hub}-"
    return {s.name.removeprefix(prefix): s for s in await topo.store.list_status(now=utcnow())}


async def test_every_process_reports_its_status_and_forgets_it_on_a_clean_stop(
    topo: Topology,
) -> None:
    ports = await start_with_metrics(topo)

    async def all_reported() -> dict[str, ComponentStatus] | None:
        found = await statuses(topo)
        ready = set(found) == set(KINDS) and found["supervisor-1"].data["leader"] is True
        return found if ready else None

    found = await eventually(all_reported, timeout=20, what="a status of every process")
    for label, status in found.items():
        assert status.kind == KINDS[label]
        assert status.data["metrics_port"] == ports[label]
        assert status.data["pid"] == topo.procs[label].pid
        assert status.at < status.expires_at
    assert {"paused": False, "backlog": 0}.items() <= found["submission"].data.items()
    assert {"inflight", "started"} <= set(found["scheduler-1"].data)
    for agent in AGENTS:
        assert found[agent].data["open_breakers"] == []
        assert set(found[agent].data["breakers"].values()) <= {"closed"}

    submit(topo, "--count", "3")
    await topo.wait_settled(3, timeout=30)

    async def counted() -> bool:
        found = await statuses(topo)
        return found["scheduler-1"].data["started"] >= 3 and found["payment"].data["breakers"] == {
            "payment.charge": "closed"
        }

    await eventually(counted, what="heartbeats to show the attempts and the breaker used")

    topo.signal("scheduler-1", signal.SIGTERM)
    assert topo.procs["scheduler-1"].wait(timeout=20) == 0
    assert set(await statuses(topo)) == set(KINDS) - {"scheduler-1"}


async def stored(topo: Topology, kind: AlertKind) -> list[Alert]:
    return [a for a in await topo.store.list_alerts(limit=1000) if a.kind is kind]


async def test_an_agent_alerts_once_when_a_circuit_stays_open(topo: Topology) -> None:
    topo.env = topo.env | {"ORDERFLOW_CIRCUIT_ALERT_AFTER_S": "1"}
    ports = await start_with_metrics(topo)
    await topo.remote.set_faults(outage=True)
    submit(topo, "--count", "3")

    async def circuit_alert() -> list[Alert]:
        return await stored(topo, AlertKind.CIRCUIT_OPEN)

    alerts = await eventually(circuit_alert, timeout=20, what="a circuit-open alert")
    assert len(alerts) == 1
    alert = alerts[0]
    assert alert.source == f"{topo.hub}-inventory"
    assert alert.data["operation"] == "inventory.reserve"
    assert alert.alert_id.startswith(f"circuit-open:inventory.reserve:{alert.data['opened_at']}")

    samples = await scraped(ports["inventory"])
    attempts = "orderflow_agent_attempts_total"
    assert value(samples, attempts, operation="inventory.reserve", outcome="transient") >= 5
    assert value(samples, attempts, outcome="ok") == 0

    async def reported_open() -> bool:
        status = (await statuses(topo))["inventory"]
        return status.data["open_breakers"] == ["inventory.reserve"]

    await eventually(reported_open, what="the agent's heartbeat to show the open circuit")
    await metric_reaches(ports["inventory"], "orderflow_circuit_state", 1)
    # Failed trial calls do not start a new opening: still one alert, several beats later.
    await _beats_pass(topo, "inventory", after=alert)
    assert await stored(topo, AlertKind.CIRCUIT_OPEN) == alerts


async def test_schedulers_alert_once_per_period_without_a_supervisor_leader(
    topo: Topology,
) -> None:
    topo.env = topo.env | {"ORDERFLOW_NO_LEADER_ALERT_AFTER_S": "1"}
    topo.serve("scheduler-1", "scheduler")

    async def no_leader() -> list[Alert]:
        return await stored(topo, AlertKind.NO_LEADER)

    first = await eventually(no_leader, timeout=20, what="a no-leader alert")
    assert len(first) == 1
    assert first[0].source == f"{topo.hub}-scheduler-1"
    assert first[0].data["last_leader"] is None
    await _beats_pass(topo, "scheduler-1", after=first[0])
    assert await no_leader() == first, "one alert for the whole period"

    # A leader comes, then dies without releasing its lease: a new period, named by the lease's
    # expiry, which both schedulers see alike (so the store keeps one alert).
    topo.serve("supervisor-1", "supervisor")
    topo.serve("scheduler-2", "scheduler")

    async def leading() -> bool:
        found = await statuses(topo)
        supervisor = found.get("supervisor-1")
        return "scheduler-2" in found and supervisor is not None and supervisor.data["leader"]

    await eventually(leading, timeout=20, what="a supervisor to lead")
    topo.kill("supervisor-1")

    async def second() -> list[Alert]:
        alerts = await no_leader()
        return alerts if len(alerts) > 1 else []

    alerts = await eventually(second, timeout=20, what="a second no-leader alert")
    latest = alerts[0]
    assert latest.data["last_leader"] == f"{topo.hub}-supervisor-1"
    for label in ("scheduler-1", "scheduler-2"):
        await _beats_pass(topo, label, after=latest)
    assert len(await no_leader()) == 2


async def _beats_pass(topo: Topology, label: str, *, after: Alert, beats: int = 3) -> None:
    """Wait until `label` has reported several heartbeats (0.3 s apart) since the alert."""

    async def later() -> bool:
        status = (await statuses(topo)).get(label)
        return status is not None and (status.at - after.at).total_seconds() > beats * 0.3

    await eventually(later, timeout=10, what=f"{beats} more heartbeats of {label}")


def free_ports(n: int) -> int:
    """The first of `n` consecutive ports that are free right now."""
    for _ in range(50):
        base = free_port()
        try:
            for port in range(base, base + n):
                with socket.socket() as s:
                    s.bind(("0.0.0.0", port))
        except OSError:
            continue
        return base
    raise AssertionError(f"no {n} consecutive free ports")


async def test_up_gives_each_process_its_own_metrics_port(hub: str, tmp_path: Path) -> None:
    async with running_topology(hub, tmp_path, ORDERFLOW_HEARTBEAT_S="0.3") as topo:
        base = free_ports(8)
        out = (tmp_path / "up.log").open("wb")
        up = subprocess.Popen(
            [sys.executable, "-m", "services.cli", "up", "--metrics-port", str(base)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=topo.env | {"ORDERFLOW_METRICS_PORT": "1", "ORDERFLOW_API_PORT": str(free_port())},
        )
        try:

            async def started() -> dict[str, int]:
                log = (tmp_path / "up.log").read_text()
                found = re.findall(r"started (\S+) \(pid \d+\), metrics on port (\d+)", log)
                return {label: int(port) for label, port in found} if len(found) == 8 else {}

            ports = await eventually(started, timeout=30, what="up to start every process")
            assert ports == {
                label: base + i
                for i, label in enumerate(
                    ["remote", "submission", "scheduler-1", "supervisor-1"]
                    + [f"{agent}-1" for agent in AGENTS]
                    + ["api"]
                )
            }
            scheduler = await scraped(ports["scheduler-1"])
            assert value(scheduler, "orderflow_inflight") == 0
            await metric_reaches(ports["supervisor-1"], "orderflow_supervisor_leader", 1)
            for label in ("remote", "submission", "inventory-1", "payment-1", "shipping-1"):
                assert value(await scraped(ports[label]), "process_cpu_seconds_total") > 0

            # Gathered across reads: with beats 0.3 s apart a status lives 0.9 s, and on a loaded
            # machine one of the seven may be between a lapse and its next beat at any one read.
            seen: dict[str, int] = {}

            async def reported() -> dict[str, int]:
                found = await topo.store.list_status(now=utcnow())
                seen.update({s.kind: s.data["metrics_port"] for s in found})
                return dict(seen) if len(seen) == 7 else {}

            by_kind = await eventually(reported, timeout=30, what="every process's status")
            assert by_kind["scheduler"] == ports["scheduler-1"]
            assert by_kind["agent-payment"] == ports["payment-1"]
            assert by_kind["api"] == ports["api"]
            up.send_signal(signal.SIGTERM)
            assert up.wait(timeout=30) == 0
            assert await topo.store.list_status(now=utcnow()) == [], "a clean stop forgets"
        finally:
            if up.poll() is None:
                up.kill()


async def test_a_metrics_port_in_use_stops_the_process_with_one_line(topo: Topology) -> None:
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = topo.cli("serve", "scheduler", timeout=60, ORDERFLOW_METRICS_PORT=str(port))
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    last = result.stderr.strip().splitlines()[-1]
    expected = "orderflow: error: configuration: ORDERFLOW_METRICS_PORT: cannot listen on port"
    assert last.startswith(f"{expected} {port}:")
    assert await topo.store.list_status(now=utcnow()) == []
