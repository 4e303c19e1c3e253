"""The observability profile against real processes: Debian's Prometheus, on a private port with
a temporary data directory, scrapes a running topology with the profile's scrape job and alert
rules. Every dashboard panel's expression returns data, every metric the alert rules read
exists, the rules evaluate without error, and a dead letter makes its alert fire while a healthy
pipeline pages for nothing else. `orderflow snapshot` then draws the whole dashboard from that
Prometheus, and headless Chromium's screenshot of it goes to test-artifacts/observability/
(Grafana cannot run here: docs/operations/observability.md)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import re
import shutil
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aio_pika
import aiohttp
import pytest
import yaml
from playwright.async_api import async_playwright

from deployment.observability import panel_expressions, prometheus_config
from shared.broker.rabbitmq.connection import connect
from shared.domain.states import ProcessState
from shared.panels import PANELS
from tests.conftest import RABBITMQ_URL, RABBITMQ_USER, service_missing
from tests.support.topology import Topology, free_port, running_topology
from tests.support.waiting import eventually
from tests.system.test_metrics import (
    PROCESSES,
    metric_reaches,
    start_with_metrics,
    submit,
    value,
)

pytestmark = [pytest.mark.rabbitmq, pytest.mark.postgres]

ROOT = Path(__file__).resolve().parents[2]
RULES_DIR = ROOT / "infra" / "prometheus" / "rules"
ARTIFACTS = (
    Path(os.environ.get("ORDERFLOW_TEST_ARTIFACTS", ROOT / "test-artifacts")) / "observability"
)
CHROMIUM = os.environ.get("ORDERFLOW_TEST_CHROMIUM", "/usr/bin/chromium")
SERVICES = {
    "remote": "remote",
    "submission": "submission",
    "scheduler-1": "scheduler",
    "supervisor-1": "supervisor",
    **{agent: f"agent-{agent}" for agent in ("inventory", "payment", "shipping")},
}
"""Each test process's label -> the compose service it stands for (the `service` label)."""
SELECTOR = re.compile(r"\b(orderflow[\w:]*|up)\b(\{[^}]*\})?")
"""A metric selector in an expression: our metrics, the recording rule's, and `up`."""


def rule_expressions() -> dict[str, str]:
    rules = yaml.safe_load((RULES_DIR / "orderflow.rules.yml").read_text())
    return {
        rule.get("alert") or rule["record"]: rule["expr"]
        for group in rules["groups"]
        for rule in group["rules"]
    }


def selectors(expr: str) -> set[str]:
    return {name + (labels or "") for name, labels in SELECTOR.findall(expr)}


def test_the_selector_extraction_finds_every_metric_named() -> None:
    expr = rule_expressions()["OrderflowDeadLettersArriving"]
    assert selectors(expr) == {
        "orderflow_dead_letters_total",
        'orderflow_queue_depth{queue=~".+[.]dlq"}',
    }
    assert selectors('sum by (state) (orderflow:orders:sum{state="Error"}) or up') == {
        'orderflow:orders:sum{state="Error"}',
        "up",
    }


@pytest.fixture
def prometheus_binary() -> str:
    found = shutil.which("prometheus")
    if found is None:
        service_missing("prometheus (Debian's package)", "not installed")
    assert found is not None
    return found


class Prometheus:
    def __init__(self, url: str, session: aiohttp.ClientSession) -> None:
        self.url = url
        self._session = session

    async def query(self, expr: str) -> list[dict[str, Any]]:
        async with self._session.get(f"{self.url}/api/v1/query", params={"query": expr}) as r:
            body = await r.json()
        assert body["status"] == "success", (expr, body)
        result: list[dict[str, Any]] = body["data"]["result"]
        return result

    async def api(self, path: str) -> Any:
        async with self._session.get(f"{self.url}/api/v1/{path}") as r:
            body = await r.json()
        assert body["status"] == "success", (path, body)
        return body["data"]


@pytest.fixture
def chromium() -> str:
    if not Path(CHROMIUM).exists():
        service_missing("chromium (Debian's package)", "not installed")
    return CHROMIUM


@pytest.fixture
async def topo(hub: str, tmp_path: Path) -> AsyncIterator[Topology]:
    async with running_topology(hub, tmp_path, ORDERFLOW_HEARTBEAT_S="0.5") as t:
        yield t


def start_prometheus(binary: str, port: int, config: Path, data: Path, log: Path) -> Any:
    return subprocess.Popen(
        [
            binary,
            f"--config.file={config}",
            f"--storage.tsdb.path={data}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--storage.tsdb.retention.time=1h",
        ],
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
    )


def fast(config: dict[str, Any]) -> dict[str, Any]:
    """The profile's configuration, scraping and evaluating every second."""
    config["global"] = {"scrape_interval": "1s", "evaluation_interval": "1s"}
    for job in config["scrape_configs"]:
        job["scrape_interval"] = "1s"
    return config


async def poison(topo: Topology) -> None:
    """One malformed order: submission dead-letters it (`malformed`)."""
    connection = await connect(RABBITMQ_URL, timeout=5, name="observability-test")
    try:
        channel = await connection.channel()
        message = aio_pika.Message(
            b"{not json", message_id="poison-obs", type="order.submit", user_id=RABBITMQ_USER
        )
        await channel.default_exchange.publish(message, routing_key=f"{topo.hub}.orders")
    finally:
        await connection.close()


async def test_every_panel_and_rule_reads_metrics_the_processes_export(
    topo: Topology, prometheus_binary: str, chromium: str, tmp_path: Path
) -> None:
    ports = await start_with_metrics(topo)
    targets = {SERVICES[label]: [f"127.0.0.1:{port}"] for label, port in ports.items()}
    config = fast(prometheus_config(targets, rules=str(RULES_DIR)))
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    log = tmp_path / "prometheus.log"
    started = asyncio.get_running_loop().time()
    server = start_prometheus(
        prometheus_binary, port, tmp_path / "prometheus.yml", tmp_path / "tsdb", log
    )
    url = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
            prom = Prometheus(url, session)
            await every_target_up(prom, len(PROCESSES), log)
            assert submit(topo, "--count", "30", "--seed", "5")["published"] == 30
            assert (await topo.wait_settled(30, timeout=90))[ProcessState.PROCESSED] == 30
            await poison(topo)
            await check_expressions(prom)
            await check_alerts(prom)
            await snapshot(topo, prom, chromium, since=started)
    finally:
        server.terminate()
        server.wait(timeout=30)


async def every_target_up(prom: Prometheus, n: int, log: Path) -> None:
    async def up() -> bool:
        try:
            result = await prom.query('up{job="orderflow"} == 1')
        except aiohttp.ClientConnectionError:
            return False
        return len(result) == n

    await eventually(up, timeout=60, interval=0.5, what=f"{n} targets up ({log})")


async def check_expressions(prom: Prometheus) -> None:
    """Every panel's expression returns data once the dead letter is counted (rates need two
    scrapes of it); every selector of every rule names series that exist, and the rule's
    whole expression evaluates."""

    async def dead_letter_seen() -> bool:
        # (`increase` of a counter whose series appears at 1 is 0: no earlier sample. The
        # dead-letter rule reads the growing .dlq as well for that reason.)
        counted = await prom.query("count_over_time(orderflow_dead_letters_total[1m]) >= 2")
        waiting = await prom.query('orderflow_queue_depth{queue=~".+[.]dlq"} > 0')
        return bool(counted and waiting)

    await eventually(dead_letter_seen, timeout=30, interval=0.5, what="the dead letter counted")

    async def empty_panels() -> list[str]:
        # A value, not NaN: a quantile of a rate that saw nothing is NaN, a gap on the graph.
        return [
            expr
            for expr in panel_expressions()
            if not any(math.isfinite(float(r["value"][1])) for r in await prom.query(expr))
        ]

    async def every_panel_has_data() -> bool:
        # A rate needs two scrapes of its series; on a loaded machine a scrape can come late.
        return not await empty_panels()

    with contextlib.suppress(AssertionError):  # the assertion below names what stayed empty
        await eventually(every_panel_has_data, timeout=30, interval=0.5, what="every panel's data")
    assert await empty_panels() == [], "panels without data"
    missing = {
        name: selector
        for name, expr in rule_expressions().items()
        for selector in selectors(expr)
        if not await prom.query(selector)
    }
    assert missing == {}, "rules reading series that do not exist"
    for expr in rule_expressions().values():
        await prom.query(expr)  # asserts that it evaluates
    # The metrics added for the rules, with their values: submission's backlog (all settled),
    # its threshold (the default), not paused (every process exports these gauges, at 0 but in
    # submission); the recoveries at 0 for each target state.
    by_service = {"orderflow_backlog": 0, "orderflow_backlog_threshold": 5000}
    for metric, wanted in by_service.items():
        assert (await values(prom, metric, by="service"))["submission"] == wanted
        assert await prom.query(f"{metric} > 0 unless {metric}{{service='submission'}}") == []
    assert await values(prom, "orderflow_submission_paused", by="service") == dict.fromkeys(
        SERVICES.values(), 0
    )
    recoveries = await values(prom, "orderflow_supervisor_recoveries_total", by="to")
    assert recoveries == dict.fromkeys(
        ["Pending", "Error", "Compensating", "CompensationFailed"], 0
    )


async def values(prom: Prometheus, metric: str, *, by: str = "") -> dict[str, float]:
    result = await prom.query(f"{metric}{{job='orderflow'}}")
    return {r["metric"].get(by, ""): float(r["value"][1]) for r in result}


async def check_alerts(prom: Prometheus) -> None:
    """The dead letter pages (its rule has no `for`); nothing else does on a healthy run."""

    async def firing() -> set[str] | None:
        alerts = (await prom.api("alerts"))["alerts"]
        names = {a["labels"]["alertname"] for a in alerts if a["state"] == "firing"}
        return names if "OrderflowDeadLettersArriving" in names else None

    names = await eventually(firing, timeout=30, interval=0.5, what="the dead-letter alert")
    assert names == {"OrderflowDeadLettersArriving"}
    pending = {a["labels"]["alertname"] for a in (await prom.api("alerts"))["alerts"]}
    assert pending == {"OrderflowDeadLettersArriving"}
    groups = (await prom.api("rules"))["groups"]
    health = {r["name"]: r["health"] for g in groups for r in g["rules"]}
    assert set(health.values()) == {"ok"}, health


DRAWN = """() => [...document.querySelectorAll('main section')].map(section => ({
    title: section.querySelector('h2').textContent,
    lines: section.querySelectorAll('svg polyline, svg circle').length,
}))"""
"""Each panel of the snapshot page as Chromium laid it out: its title and the series drawn."""


async def snapshot(topo: Topology, prom: Prometheus, chromium: str, *, since: float) -> None:
    """`orderflow snapshot` of the real Prometheus since `since` (its start, on the loop's
    clock): every panel of the dashboard, in its order, with a series drawn in each; the page
    as Chromium shows it goes to the artifacts."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    minutes = max(0.25, (asyncio.get_running_loop().time() - since) / 60)
    page_path = ARTIFACTS / "dashboard.html"
    done = topo.cli(
        "snapshot",
        "--prometheus",
        prom.url,
        "--minutes",
        f"{minutes:.2f}",
        "--out",
        str(page_path),
    )
    assert done.returncode == 0, done.stderr
    assert f"{len(PANELS)} panels from {prom.url}, each with data" in done.stderr, done.stderr
    async with async_playwright() as p:
        browser = await p.chromium.launch(
            executable_path=chromium,
            args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"],
        )
        try:
            page = await browser.new_page(viewport={"width": 1320, "height": 900})
            await page.goto(page_path.as_uri())
            drawn = await page.evaluate(DRAWN)
            await page.screenshot(path=str(ARTIFACTS / "dashboard.png"), full_page=True)
        finally:
            await browser.close()
    assert [d["title"] for d in drawn] == [panel.title for panel in PANELS]
    assert [d["title"] for d in drawn if d["lines"] == 0] == [], "panels drawn empty"
    (ARTIFACTS / "drawn.json").write_text(json.dumps(drawn, indent=2))


async def test_the_backlog_metrics_follow_submissions_admission_control(topo: Topology) -> None:
    """What the backlog rule reads: over the threshold, submission pauses and says so; once the
    pipeline drains the backlog, it resumes and the gauges fall back."""
    topo.env["ORDERFLOW_BACKLOG_THRESHOLD"] = "5"
    topo.env["ORDERFLOW_BACKLOG_CHECK_S"] = "0.1"
    port = free_port()
    topo.serve("submission", "submission", ORDERFLOW_PREFETCH="1", ORDERFLOW_METRICS_PORT=str(port))
    assert await metric_reaches(port, "orderflow_backlog_threshold", 5)
    assert submit(topo, "--count", "30")["published"] == 30
    samples = await metric_reaches(port, "orderflow_submission_paused", 1)
    assert 5 < value(samples, "orderflow_backlog") <= 5 + 2
    await topo.start_all()
    assert (await topo.wait_settled(30, timeout=60))[ProcessState.PROCESSED] == 30
    samples = await metric_reaches(port, "orderflow_backlog", 0)
    assert value(samples, "orderflow_submission_paused") == 0
