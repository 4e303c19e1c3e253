"""The dashboard's panels, as data: the PromQL over the metrics the processes export
(shared/metrics.py). The deployment's Grafana dashboard is generated from them, and the operator's
`orderflow snapshot` queries and draws the same ones."""

from __future__ import annotations

from dataclasses import dataclass


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
