"""The compose profile `observability`: Prometheus's scrape configuration, Grafana's provisioned
datasources and dashboard, all generated from here (the alert rules are written by hand, in
infra/prometheus/rules/, with their unit tests beside them).

The dashboard's panels are data (`PANELS`): the same expressions are written into the Grafana
dashboard and queried by tests/system/test_observability.py against a real Prometheus scraping
real processes, so that no panel names a metric nothing exports.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

SCRAPED = (
    "remote",
    "submission",
    "scheduler",
    "supervisor",
    "agent-inventory",
    "agent-payment",
    "agent-shipping",
    "api",
    "notifier",
)
"""The compose services that serve /metrics on port 9100 (the `monitoring` network's members,
beside Prometheus). Replicas are found through Docker's DNS: one name, one address each."""
METRICS_PORT = 9100
JOB = "orderflow"
SCRAPE_INTERVAL = "15s"
RULES_DIR = "/etc/prometheus/rules"
"""Where the compose service mounts infra/prometheus/rules (the `*.rules.yml` files load)."""
JAEGER_URL = "http://jaeger:16686"
PROMETHEUS_URL = "http://prometheus:9090"
DASHBOARD_UID = "orderflow-overview"


@dataclass(frozen=True)
class Panel:
    """One graph: its title, the unit Grafana shows, and its PromQL expressions with a legend."""

    title: str
    unit: str
    targets: tuple[tuple[str, str], ...]


PANELS = (
    Panel("Orders by state", "short", (("sum by (state) (orderflow_orders)", "{{state}}"),)),
    Panel(
        "Throughput: orders recorded and claimed per second",
        "ops",
        (
            (
                'sum(rate(orderflow_messages_total{queue=~".+[.]orders",outcome="handled"}[1m]))',
                "recorded",
            ),
            ("sum by (kind) (rate(orderflow_claims_total[1m]))", "claimed ({{kind}})"),
        ),
    ),
    Panel(
        "Step latency (p50, p95)",
        "s",
        (
            (
                "histogram_quantile(0.5, sum by (le, step, action) "
                "(rate(orderflow_step_seconds_bucket[5m])))",
                "p50 {{step}} {{action}}",
            ),
            (
                "histogram_quantile(0.95, sum by (le, step, action) "
                "(rate(orderflow_step_seconds_bucket[5m])))",
                "p95 {{step}} {{action}}",
            ),
        ),
    ),
    Panel(
        "Step outcomes per second",
        "ops",
        (
            (
                "sum by (step, action, outcome) (rate(orderflow_step_outcomes_total[5m]))",
                "{{step}} {{action}} {{outcome}}",
            ),
        ),
    ),
    Panel(
        "Recoveries (last 5 min)",
        "short",
        (("sum by (to) (increase(orderflow_supervisor_recoveries_total[5m]))", "to {{to}}"),),
    ),
    Panel(
        "Circuit breakers (0 closed, 1 open, 2 half-open)",
        "short",
        (("max by (operation) (orderflow_circuit_state)", "{{operation}}"),),
    ),
    Panel(
        "Input queue depths",
        "short",
        (('max by (queue) (orderflow_queue_depth{queue!~".+[.]dlq"})', "{{queue}}"),),
    ),
    Panel(
        "Dead letters: waiting and arriving",
        "short",
        (
            ('max by (queue) (orderflow_queue_depth{queue=~".+[.]dlq"})', "{{queue}}"),
            (
                "sum by (queue, reason) (increase(orderflow_dead_letters_total[5m]))",
                "new from {{queue}}: {{reason}}",
            ),
        ),
    ),
    Panel(
        "Backlog and admission threshold",
        "short",
        (
            ("max(orderflow_backlog)", "backlog"),
            ("max(orderflow_backlog_threshold)", "threshold"),
        ),
    ),
    Panel(
        "Supervisor leader",
        "short",
        (
            # Every process exports the gauge (at 0); the supervisors' are the ones that count.
            (
                'max by (instance) (orderflow_supervisor_leader{service="supervisor"})',
                "{{instance}}",
            ),
        ),
    ),
    Panel("Processes up", "short", (('up{job="orderflow"}', "{{service}} {{instance}}"),)),
)


def block_yaml(value: Any, indent: int = 0) -> list[str]:
    """Block-style YAML of dicts, lists and scalars (strings double-quoted as JSON, which YAML
    reads alike): the runtime has no YAML library, and these files need no more."""
    pad = "  " * indent
    if isinstance(value, dict):
        lines = []
        for key, item in value.items():
            if isinstance(item, dict | list) and item:
                lines += [f"{pad}{key}:", *block_yaml(item, indent + 1)]
            else:
                lines.append(f"{pad}{key}: {_scalar(item)}")
        return lines
    if isinstance(value, list):
        lines = []
        for item in value:
            inner = block_yaml(item, indent + 1)
            lines.append(f"{pad}- {inner[0].lstrip()}")
            lines += inner[1:]
        return lines
    return [f"{pad}{_scalar(value)}"]


def _scalar(value: Any) -> str:
    if isinstance(value, dict | list):
        return "{}" if isinstance(value, dict) else "[]"
    return json.dumps(value)


def _dump(header: str, data: dict[str, Any]) -> str:
    return header + "\n".join(block_yaml(data)) + "\n"


def scrape_job(targets: dict[str, list[str]] | None = None) -> dict[str, Any]:
    """The job scraping every orderflow process, labelled by its service. Without `targets`
    (compose), each service's replicas are found by DNS; with them (a test), the given
    `host:port` addresses per service."""
    job: dict[str, Any] = {"job_name": JOB, "scrape_interval": SCRAPE_INTERVAL}
    if targets is None:
        job["dns_sd_configs"] = [
            {"names": [name], "type": "A", "port": METRICS_PORT, "refresh_interval": "30s"}
            for name in SCRAPED
        ]
        job["relabel_configs"] = [
            {"source_labels": ["__meta_dns_name"], "target_label": "service"},
        ]
    else:
        job["static_configs"] = [
            {"targets": addresses, "labels": {"service": service}}
            for service, addresses in targets.items()
        ]
    return job


def prometheus_config(
    targets: dict[str, list[str]] | None = None, *, rules: str = RULES_DIR
) -> dict[str, Any]:
    return {
        "global": {"scrape_interval": SCRAPE_INTERVAL, "evaluation_interval": SCRAPE_INTERVAL},
        "rule_files": [f"{rules}/*.rules.yml"],
        "scrape_configs": [scrape_job(targets)],
    }


def prometheus_yml() -> str:
    return _dump(
        "# Generated by `orderflow deploy write` (services/deploy/observability.py): Prometheus\n"
        "# in the compose profile `observability`, scraping every orderflow process's /metrics\n"
        "# on the monitoring network. The alert rules are infra/prometheus/rules/*.rules.yml.\n",
        prometheus_config(),
    )


def grafana_datasources() -> str:
    return _dump(
        "# Generated by `orderflow deploy write`: Grafana's datasources in the profile\n"
        "# `observability` (Prometheus for the dashboard, Jaeger for the traces).\n",
        {
            "apiVersion": 1,
            "datasources": [
                {
                    "name": "Prometheus",
                    "uid": "prometheus",
                    "type": "prometheus",
                    "access": "proxy",
                    "url": PROMETHEUS_URL,
                    "isDefault": True,
                    "editable": False,
                },
                {
                    "name": "Jaeger",
                    "uid": "jaeger",
                    "type": "jaeger",
                    "access": "proxy",
                    "url": JAEGER_URL,
                    "editable": False,
                },
            ],
        },
    )


def grafana_dashboards() -> str:
    return _dump(
        "# Generated by `orderflow deploy write`: Grafana loads the dashboards in this folder.\n",
        {
            "apiVersion": 1,
            "providers": [
                {
                    "name": "orderflow",
                    "type": "file",
                    "disableDeletion": True,
                    "allowUiUpdates": False,
                    "options": {"path": "/var/lib/grafana/dashboards"},
                }
            ],
        },
    )


def _panel(index: int, panel: Panel) -> dict[str, Any]:
    width = 12
    return {
        "id": index + 1,
        "type": "timeseries",
        "title": panel.title,
        "datasource": {"type": "prometheus", "uid": "prometheus"},
        "gridPos": {"x": (index % 2) * width, "y": (index // 2) * 8, "w": width, "h": 8},
        "fieldConfig": {"defaults": {"unit": panel.unit}, "overrides": []},
        "targets": [
            {
                "refId": chr(ord("A") + n),
                "datasource": {"type": "prometheus", "uid": "prometheus"},
                "expr": expr,
                "legendFormat": legend,
            }
            for n, (expr, legend) in enumerate(panel.targets)
        ],
    }


def dashboard() -> dict[str, Any]:
    return {
        "uid": DASHBOARD_UID,
        "title": "orderflow",
        "tags": ["orderflow"],
        "timezone": "utc",
        "schemaVersion": 39,
        "version": 1,
        "refresh": "30s",
        "time": {"from": "now-1h", "to": "now"},
        "panels": [_panel(i, p) for i, p in enumerate(PANELS)],
    }


def dashboard_json() -> str:
    return json.dumps(dashboard(), indent=2) + "\n"


def panel_expressions() -> list[str]:
    return [expr for panel in PANELS for expr, _ in panel.targets]


def observability_files() -> dict[str, str]:
    """Path relative to the repository root -> content."""
    return {
        "infra/prometheus/prometheus.yml": prometheus_yml(),
        "infra/grafana/provisioning/datasources/orderflow.yml": grafana_datasources(),
        "infra/grafana/provisioning/dashboards/orderflow.yml": grafana_dashboards(),
        "infra/grafana/dashboards/orderflow.json": dashboard_json(),
    }
