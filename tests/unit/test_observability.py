"""Metrics, heartbeats and the runtime alerts' rules, without any server (issue 5)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
from datetime import UTC, datetime, timedelta
from typing import Any

import click
import pybreaker
import pytest

from services.agents.agent import Agent
from services.agents.attempts import MemoryTickets
from services.agents.breakers import Breakers
from services.agents.calls import attempt_outcome
from services.cli.up import metrics_ports, topology
from services.scheduler.leader_watch import LeaderWatch
from shared.config import load_settings
from shared.domain.coordination import ComponentStatus, Lease
from shared.domain.journal import Alert, AlertKind, Severity
from shared.errors import (
    ConfigurationError,
    RemoteDeclined,
    RemoteFenced,
    RemoteTransient,
    ServiceUnavailable,
)
from shared.heartbeat import Heartbeat, status_of
from shared.metrics import REGISTRY, exposition
from shared.telemetry import JsonFormatter, bind_log_fields, log_fields
from tests.support.waiting import eventually

T0 = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)


# -- settings


def test_the_new_settings_default_to_no_endpoint_and_documented_thresholds() -> None:
    s = load_settings()
    assert (s.observability.metrics_port, s.observability.heartbeat_s) == (0, 5.0)
    assert (s.agents.circuit_alert_after_s, s.observability.no_leader_alert_after_s) == (
        30.0,
        60.0,
    )


@pytest.mark.parametrize(
    ("env", "value"),
    [
        ("ORDERFLOW_METRICS_PORT", "-1"),
        ("ORDERFLOW_METRICS_PORT", "65536"),
        ("ORDERFLOW_METRICS_PORT", "http"),
        ("ORDERFLOW_HEARTBEAT_S", "0"),
        ("ORDERFLOW_CIRCUIT_ALERT_AFTER_S", "0"),
        ("ORDERFLOW_NO_LEADER_ALERT_AFTER_S", "-5"),
    ],
)
def test_bad_observability_settings_name_their_variable(
    monkeypatch: pytest.MonkeyPatch, env: str, value: str
) -> None:
    monkeypatch.setenv(env, value)
    with pytest.raises(ConfigurationError, match=env):
        load_settings()


@pytest.mark.parametrize("port", ["0", "9100", "65535"])
def test_metrics_port_takes_every_port(monkeypatch: pytest.MonkeyPatch, port: str) -> None:
    monkeypatch.setenv("ORDERFLOW_METRICS_PORT", port)
    assert load_settings().observability.metrics_port == int(port)


# -- `orderflow up` ports


def test_up_gives_each_process_its_own_port_in_start_order() -> None:
    procs = topology(2, 1, 1, True)
    ports = metrics_ports(procs, 9100)
    assert list(ports) == [label for label, _ in procs]
    assert list(ports.values()) == list(range(9100, 9100 + len(procs)))
    assert ports["remote"] == 9100 and ports["submission"] == 9101


def test_up_without_a_base_port_gives_none() -> None:
    assert set(metrics_ports(topology(1, 1, 1, True), 0).values()) == {0}


def test_up_refuses_ports_beyond_the_last() -> None:
    procs = topology(1, 1, 1, True)
    assert max(metrics_ports(procs, 65536 - len(procs)).values()) == 65535
    with pytest.raises(click.BadParameter, match="beyond 65535"):
        metrics_ports(procs, 65535 - len(procs) + 2)


# -- the metrics


def test_every_metric_is_exposed_under_its_orderflow_name() -> None:
    text = exposition().decode()
    for name in (
        "orderflow_orders",
        "orderflow_queue_depth",
        "orderflow_supervisor_leader",
        "orderflow_supervisor_recoveries_total",
        "orderflow_claims_total",
        "orderflow_inflight",
        "orderflow_step_seconds",
        "orderflow_step_outcomes_total",
        "orderflow_agent_attempts_total",
        "orderflow_circuit_state",
        "orderflow_messages_total",
        "orderflow_dead_letters_total",
    ):
        assert f"# TYPE {name} " in text, name


@pytest.mark.parametrize(
    ("error", "called", "outcome"),
    [
        (RemoteTransient("503"), True, "transient"),
        (RemoteDeclined("declined"), True, "permanent"),
        (RemoteFenced("stale"), True, "fenced"),
        (pybreaker.CircuitBreakerError("open"), False, "breaker_open"),
        (pybreaker.CircuitBreakerError("tripped by this call"), True, "transient"),
    ],
)
def test_each_failed_attempt_has_its_outcome(error: Exception, called: bool, outcome: str) -> None:
    assert attempt_outcome(error, called=called) == outcome


# -- circuit breakers and the circuit-open alert


def circuit_gauge(operation: str) -> float | None:
    return REGISTRY.get_sample_value("orderflow_circuit_state", {"operation": operation})


def fail(breaker: pybreaker.CircuitBreaker) -> None:
    with contextlib.suppress(RemoteTransient, pybreaker.CircuitBreakerError), breaker.calling():
        raise RemoteTransient("503")


def test_an_opening_lasts_until_the_circuit_closes_again() -> None:
    breakers = Breakers(fail_max=2, reset_s=60)
    breaker = breakers.get("unit.open")
    assert circuit_gauge("unit.open") == 0
    fail(breaker)
    assert breakers.states() == {"unit.open": "closed"}
    fail(breaker)
    assert breakers.open() == ["unit.open"]
    assert circuit_gauge("unit.open") == 1
    opened = breakers.open_longer_than(timedelta(0), now=datetime.now(UTC) + timedelta(1))
    assert list(opened) == ["unit.open"]
    first = opened["unit.open"]

    breaker.half_open()
    assert circuit_gauge("unit.open") == 2
    assert breakers.open() == [], "half-open is not failing fast"
    breaker.open()  # the trial call failed: the same opening goes on
    later = datetime.now(UTC) + timedelta(hours=1)
    assert breakers.open_longer_than(timedelta(seconds=1), now=later) == {"unit.open": first}
    assert breakers.open_longer_than(timedelta(hours=2), now=later) == {}

    breaker.close()
    assert circuit_gauge("unit.open") == 0
    assert breakers.open_longer_than(timedelta(0), now=later) == {}


class FakeReporter:
    source = "agent-unit-1"

    def __init__(self) -> None:
        self.alerts: list[dict[str, Any]] = []

    async def alert(self, kind: AlertKind, message: str, **fields: Any) -> None:
        self.alerts.append({"kind": kind, "message": message, **fields})


async def test_an_agent_alerts_once_per_opening_past_the_threshold() -> None:
    settings = load_settings(breaker_fail_max=1, circuit_alert_after_s=30)
    agent = Agent(
        "unit",
        None,  # type: ignore[arg-type]
        None,  # type: ignore[arg-type]
        settings.agents,
        hub=settings.hub,
        ticket_keep_s=settings.broker.inbox_ttl_s,
        tickets=MemoryTickets(),
    )
    report = FakeReporter()
    breaker = agent.breaker("unit.call")
    fail(breaker)
    now = datetime.now(UTC)
    await agent.alert_open_circuits(report, now=now + timedelta(seconds=10))  # type: ignore[arg-type]
    assert report.alerts == [], "not open for long enough yet"
    for _ in range(3):
        await agent.alert_open_circuits(report, now=now + timedelta(seconds=40))  # type: ignore[arg-type]
    assert len(report.alerts) == 1
    alert = report.alerts[0]
    assert alert["kind"] is AlertKind.CIRCUIT_OPEN and alert["operation"] == "unit.call"
    assert alert["alert_id"] == f"circuit-open:unit.call:{alert['opened_at']}:agent-unit-1"
    assert agent.status() == {
        "agent": "unit",
        "open_breakers": ["unit.call"],
        "breakers": {"unit.call": "open"},
    }

    breaker.close()
    fail(breaker)  # a new opening, a new alert
    await agent.alert_open_circuits(report, now=datetime.now(UTC) + timedelta(seconds=40))  # type: ignore[arg-type]
    assert len(report.alerts) == 2
    assert report.alerts[1]["alert_id"] != alert["alert_id"]


# -- the no-leader watch


class FakeStore:
    def __init__(self) -> None:
        self.lease: Lease | None = None
        self.alerts: list[Alert] = []
        self.statuses: dict[str, ComponentStatus] = {}
        self.reports = 0
        self.fail_reports = False

    async def lease_get(self, name: str) -> Lease | None:
        assert name == "supervisor"
        return self.lease

    async def list_alerts(self, *, since: datetime | None = None, limit: int = 100) -> list[Alert]:
        return [a for a in self.alerts if since is None or a.at >= since]

    async def report_status(self, status: ComponentStatus) -> None:
        self.reports += 1
        if self.fail_reports:
            raise ServiceUnavailable("store down")
        self.statuses[status.name] = status

    async def forget_status(self, name: str) -> None:
        self.statuses.pop(name, None)


def lease(expires_at: datetime, holder: str = "sup-1") -> Lease:
    return Lease(name="supervisor", holder=holder, expires_at=expires_at, acquired_at=T0)


def test_a_leaderless_period_starts_when_the_lease_expired_or_when_none_was_first_seen() -> None:
    watch = LeaderWatch(FakeStore(), FakeReporter(), after=timedelta(seconds=60))  # type: ignore[arg-type]

    def at(seconds: float) -> datetime:
        return T0 + timedelta(seconds=seconds)

    assert watch.leaderless_since(lease(at(5)), now=at(0)) is None, "a supervisor leads"
    assert watch.leaderless_since(lease(at(0)), now=at(9)) == at(0), "since the lease expired"
    assert watch.leaderless_since(None, now=at(10)) == at(10), "since this watcher saw none"
    assert watch.leaderless_since(None, now=at(20)) == at(10), "the same period goes on"
    assert watch.leaderless_since(lease(at(30)), now=at(25)) is None, "a leader again"
    assert watch.leaderless_since(None, now=at(40)) == at(40), "a new period"


async def test_the_watch_alerts_once_per_leaderless_period() -> None:
    store, report = FakeStore(), FakeReporter()
    watch = LeaderWatch(store, report, after=timedelta(seconds=0))  # type: ignore[arg-type]
    store.lease = lease(datetime.now(UTC) + timedelta(minutes=1))
    await watch.check()
    assert report.alerts == [], "a supervisor leads"
    store.lease = lease(datetime.now(UTC) - timedelta(seconds=1), holder="sup-1")
    for _ in range(3):
        await watch.check()
    assert len(report.alerts) == 1
    expired = report.alerts[0]
    assert expired["kind"] is AlertKind.NO_LEADER and expired["last_leader"] == "sup-1"
    since = store.lease.expires_at.isoformat(timespec="milliseconds")
    assert expired["alert_id"] == f"no-leader:{since}"
    # Another watcher names this period alike.
    other = FakeReporter()
    await LeaderWatch(store, other, after=timedelta(0)).check()  # type: ignore[arg-type]
    assert other.alerts[0]["alert_id"] == expired["alert_id"]

    store.lease = None  # released: a new period, from when this watcher first saw no lease
    now = datetime.now(UTC)
    for seconds in range(3):
        await watch.check(now + timedelta(seconds=seconds))
    assert len(report.alerts) == 2 and report.alerts[1]["last_leader"] is None


async def test_without_a_lease_an_alert_another_watcher_raised_is_enough() -> None:
    store, report = FakeStore(), FakeReporter()
    watch = LeaderWatch(store, report, after=timedelta(0))  # type: ignore[arg-type]
    store.alerts.append(
        Alert(
            alert_id="no-leader:elsewhere",
            kind=AlertKind.NO_LEADER,
            severity=Severity.CRITICAL,
            message="m",
            at=datetime.now(UTC) + timedelta(seconds=1),
        )
    )
    now = datetime.now(UTC)
    await watch.check(now)
    await watch.check(now + timedelta(seconds=2))
    assert report.alerts == []
    store.alerts.clear()
    await watch.check(now + timedelta(seconds=3))
    assert report.alerts == [], "the period was reported already"


# -- heartbeats


def test_a_status_expires_after_three_missed_beats() -> None:
    status = status_of(
        "sched-1",
        "scheduler",
        now=T0,
        every=timedelta(seconds=5),
        metrics_port=0,
        data={"inflight": 2},
    )
    assert status.expires_at == T0 + timedelta(seconds=15)
    assert status.data == {"inflight": 2, "metrics_port": None, "pid": os.getpid()}
    with_port = status_of("a", "agent-x", now=T0, every=timedelta(1), metrics_port=9100, data={})
    assert with_port.data["metrics_port"] == 9100


async def test_a_heartbeat_reports_runs_its_checks_and_forgets_on_exit() -> None:
    store = FakeStore()
    checked: list[int] = []

    async def failing_check() -> None:
        checked.append(1)
        raise RuntimeError("a check that fails does not stop the beat")

    beat = Heartbeat(
        store,  # type: ignore[arg-type]
        name="p-1",
        kind="submission",
        every_s=0.01,
        metrics_port=0,
        data=lambda: {"paused": False},
        checks=(failing_check,),
    )
    async with beat:
        await eventually(lambda: asyncio.sleep(0, len(checked) >= 3), what="three beats")
        assert store.statuses["p-1"].data["paused"] is False
        store.fail_reports = True  # the store goes away: the beat goes on
        reports = store.reports
        await eventually(lambda: asyncio.sleep(0, store.reports >= reports + 2), what="beats")
    assert store.statuses == {}, "a clean stop forgets the status"


def _log_line(message: str) -> dict[str, Any]:
    record = logging.getLogger("orderflow.test").makeRecord(
        "orderflow.test", logging.INFO, __file__, 1, message, (), None
    )
    return json.loads(JsonFormatter(process="scheduler-1", hub="shop").format(record))


def test_log_lines_carry_the_fields_bound_for_the_work_in_hand() -> None:
    assert "order_id" not in _log_line("idle")
    with log_fields(order_id="ord-1", instance_id="ord-1:2", step=None):
        line = _log_line("step started")
        with log_fields(step="reserve"):
            inner = _log_line("reply")
        after = _log_line("between steps")
    assert line["order_id"] == "ord-1" and line["instance_id"] == "ord-1:2"
    assert "step" not in line  # None binds nothing
    assert inner["step"] == "reserve" and inner["order_id"] == "ord-1"
    assert "step" not in after
    assert (line["hub"], line["process"]) == ("shop", "scheduler-1")
    assert "order_id" not in _log_line("idle again")


async def test_bound_log_fields_stay_in_their_own_task() -> None:
    seen: dict[str, dict[str, Any]] = {}

    async def attempt(order_id: str) -> None:
        bind_log_fields(order_id=order_id)
        await asyncio.sleep(0)
        seen[order_id] = _log_line("working")

    await asyncio.gather(attempt("a"), attempt("b"))
    assert seen["a"]["order_id"] == "a" and seen["b"]["order_id"] == "b"
    assert "order_id" not in _log_line("outside")
