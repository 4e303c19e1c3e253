"""The observability profile's Prometheus files, checked by Prometheus's own tool: the generated
configuration (`promtool check config`), the alert rules (`promtool check rules`) and their unit
tests (`promtool test rules`), plus what promtool cannot see: every alert says how bad it is,
what it means and where its runbook is, and has a test where it fires and one where it is quiet.
promtool is Debian's `prometheus` package (.ci/run installs it)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from deployment.observability import (
    SCRAPED,
    block_yaml,
    panel_expressions,
    prometheus_config,
)
from shared.panels import PANELS
from tests.conftest import service_missing
from tests.unit.test_compose import COMPOSE

ROOT = Path(__file__).resolve().parents[2]
RULES_DIR = ROOT / "infra" / "prometheus" / "rules"
RULES = RULES_DIR / "orderflow.rules.yml"
RULE_TESTS = RULES_DIR / "orderflow.test.yml"
GUIDE = "docs/operations/guide.md"  # the operator's guide: each alert's runbook
SEVERITIES = {"warning", "critical"}
PAGES_FOR = {
    "OrderflowOrdersEnteredError",
    "OrderflowOrdersEnteredCompensationFailed",
    "OrderflowCircuitOpenTooLong",
    "OrderflowNoSupervisorLeader",
    "OrderflowDeadLettersArriving",
    "OrderflowBacklogNearThreshold",
    "OrderflowOrdersStuckPending",
    "OrderflowProcessDown",
    "OrderflowServiceAbsent",
}
"""The conditions issue 19 names, one alert each (heartbeats: a process down, or every replica
of a service gone)."""


@pytest.fixture(scope="module")
def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        service_missing("promtool (Debian's prometheus package)", "not installed")
    assert found is not None
    return found


def run(promtool: str, *args: str, cwd: Path = RULES_DIR) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [promtool, *args], cwd=cwd, capture_output=True, text=True, timeout=120, check=False
    )


def alerts(rules: dict[str, Any]) -> list[dict[str, Any]]:
    return [rule for group in rules["groups"] for rule in group["rules"] if "alert" in rule]


def anchors(markdown: str) -> set[str]:
    """GitHub's anchors for the headings of a Markdown text."""
    found = set()
    for heading in re.findall(r"^#+ (.+)$", markdown, re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        found.add(slug)
    return found


def annotation_problems(rules: dict[str, Any]) -> list[str]:
    problems = []
    for rule in alerts(rules):
        name = rule["alert"]
        if rule.get("labels", {}).get("severity") not in SEVERITIES:
            problems.append(f"{name}: severity {rule.get('labels', {}).get('severity')!r}")
        notes = rule.get("annotations", {})
        for key in ("summary", "description", "runbook_url"):
            if not notes.get(key):
                problems.append(f"{name}: no {key}")
        page, _, anchor = str(notes.get("runbook_url", "")).partition("#")
        if page != GUIDE or anchor not in anchors((ROOT / GUIDE).read_text()):
            problems.append(f"{name}: runbook {notes.get('runbook_url')!r} is no guide section")
    return problems


def coverage_problems(rules: dict[str, Any], tests: dict[str, Any]) -> list[str]:
    fired: set[str] = set()
    quiet: set[str] = set()
    for case in tests["tests"]:
        for check in case.get("alert_rule_test", []):
            (fired if check.get("exp_alerts") else quiet).add(check["alertname"])
    problems = []
    for name in (rule["alert"] for rule in alerts(rules)):
        if name not in fired:
            problems.append(f"{name}: no test where it fires")
        if name not in quiet:
            problems.append(f"{name}: no test where it stays quiet")
    return problems


def test_every_alert_is_documented_and_tested_both_ways() -> None:
    rules = yaml.safe_load(RULES.read_text())
    tests = yaml.safe_load(RULE_TESTS.read_text())
    assert {rule["alert"] for rule in alerts(rules)} == PAGES_FOR
    assert annotation_problems(rules) == []
    assert coverage_problems(rules, tests) == []


def test_the_documentation_and_coverage_checks_can_fail() -> None:
    rules = yaml.safe_load(RULES.read_text())
    first = alerts(rules)[0]
    del first["labels"]["severity"]
    first["annotations"]["runbook_url"] = f"{GUIDE}#no-such-section"
    assert annotation_problems(rules) == [
        f"{first['alert']}: severity None",
        f"{first['alert']}: runbook '{GUIDE}#no-such-section' is no guide section",
    ]
    tests = yaml.safe_load(RULE_TESTS.read_text())
    for case in tests["tests"]:
        case["alert_rule_test"] = [
            c for c in case.get("alert_rule_test", []) if c["alertname"] != first["alert"]
        ]
    assert coverage_problems(rules, tests) == [
        f"{first['alert']}: no test where it fires",
        f"{first['alert']}: no test where it stays quiet",
    ]


def test_promtool_accepts_the_rules_and_their_unit_tests_pass(promtool: str) -> None:
    checked = run(promtool, "check", "rules", RULES.name)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS: 10 rules found" in checked.stdout
    tested = run(promtool, "test", "rules", RULE_TESTS.name)
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert "SUCCESS" in tested.stdout


def test_the_rule_unit_tests_can_fail(promtool: str, tmp_path: Path) -> None:
    """A rule that pages too late (or never) fails its unit test."""
    text = RULES.read_text().replace(">= 0.8 * max(orderflow_backlog_threshold)", "> 5000")
    (tmp_path / RULES.name).write_text(text)
    shutil.copy(RULE_TESTS, tmp_path)
    tested = run(promtool, "test", "rules", RULE_TESTS.name, cwd=tmp_path)
    assert tested.returncode != 0
    assert "OrderflowBacklogNearThreshold" in tested.stdout + tested.stderr


def test_promtool_accepts_the_generated_configuration(promtool: str, tmp_path: Path) -> None:
    """The committed prometheus.yml, with its rules directory pointed at the repository's (in
    the container it is mounted at /etc/prometheus/rules)."""
    committed = yaml.safe_load((ROOT / "infra" / "prometheus" / "prometheus.yml").read_text())
    assert committed == prometheus_config()
    config = tmp_path / "prometheus.yml"
    config.write_text(yaml.safe_dump(prometheus_config(rules=str(RULES_DIR))))
    checked = run(promtool, "check", "config", str(config))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS: 1 rule files found" in checked.stdout
    config.write_text(config.read_text().replace("dns_sd_configs", "dns_sd_config"))
    assert run(promtool, "check", "config", str(config)).returncode != 0


def test_prometheus_scrapes_every_process_that_serves_metrics_in_compose() -> None:
    served = {
        name
        for name, svc in COMPOSE["services"].items()
        if "monitoring" in (svc.get("networks") or [])
        and svc.get("environment", {}).get("ORDERFLOW_METRICS_PORT") == "9100"
    }
    assert served == set(SCRAPED)
    prometheus = COMPOSE["services"]["prometheus"]
    assert prometheus["profiles"] == ["observability"]
    assert "monitoring" in prometheus["networks"]


def test_the_generated_grafana_files_hold_the_panels_and_datasources() -> None:
    """Written by our own small YAML emitter (the runtime has no YAML library): read back by a
    real YAML parser, they say what the code means."""
    grafana = ROOT / "infra" / "grafana"
    dashboard = json.loads((grafana / "dashboards" / "orderflow.json").read_text())
    assert [t["expr"] for p in dashboard["panels"] for t in p["targets"]] == panel_expressions()
    assert len({p["id"] for p in dashboard["panels"]}) == len(PANELS)
    sources = yaml.safe_load(
        (grafana / "provisioning" / "datasources" / "orderflow.yml").read_text()
    )
    by_uid = {s["uid"]: s for s in sources["datasources"]}
    assert by_uid["prometheus"]["url"] == "http://prometheus:9090"
    assert by_uid["jaeger"]["url"] == "http://jaeger:16686"
    used = {t["datasource"]["uid"] for p in dashboard["panels"] for t in p["targets"]}
    assert used <= set(by_uid)
    provider = yaml.safe_load(
        (grafana / "provisioning" / "dashboards" / "orderflow.yml").read_text()
    )
    mounts = COMPOSE["services"]["grafana"]["volumes"]
    path = provider["providers"][0]["options"]["path"]
    assert f"./infra/grafana/dashboards:{path}:ro" in mounts


@pytest.mark.parametrize(
    "value",
    [
        {"a": [1, "two: 2", {"b": True, "c": None}], "d": {}, "e": [], "f": 'x\ny "q"'},
        {"nested": [[1, 2], [{"k": "v"}]], "unicode": "é"},
    ],
)
def test_the_yaml_emitter_round_trips(value: dict[str, Any]) -> None:
    assert yaml.safe_load("\n".join(block_yaml(value))) == value
