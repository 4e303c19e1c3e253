"""`.env.example` and the settings every orderflow container takes from it.

Every setting (`shared.config.FIELDS`) appears in `.env.example` as `ORDERFLOW_<NAME>`, commented
out with its default and its documentation: uncommenting a line overrides the code's default.
Compose reads `.env` for interpolation only; each orderflow container gets the settings through
`infra/compose/settings.yml` (every setting, without a value: compose passes it on only when
`.env` or the shell sets it), never the whole file. No password is in `.env`: they are secret
files (deployment/secretfiles.py, `infra/secrets.sh`).
"""

from __future__ import annotations

from typing import Any

from shared.config import FIELDS

SET_BY_COMPOSE = {
    "rabbitmq_url": "each service's own RabbitMQ user, the secret file rabbitmq_<user>_url",
    "store_url": "the secret file store_url, which infra/secrets.sh writes for the profile",
    "hub": "infra/rabbitmq/definitions.json is generated for this hub",
    "remote_url": "the remote service's address",
    "remote_port": "the remote service listens on the port of its address",
    "metrics_port": "9100 in every container",
    "metrics_host": "0.0.0.0 in every container: Prometheus scrapes it on the monitoring network",
    "remote_account_key": "the agents' secret file remote_account_key",
    "remote_fence_key": "the schedulers' secret file remote_fence_key",
    "remote_ledger_path": "the remote service's volume",
    "seal_key": "never every container's: the operator and the shop must not hold it (unset, "
    "each kind's key derives from its own broker password)",
}
"""Settings docker-compose.yml sets itself, per service: not passed from `.env`."""

NOT_SETTINGS = {
    "ORDERFLOW_SECRETS_DIR": "where an orderflow container reads its secret files",
    "ORDERFLOW_REMOTE_ADMIN_TOKEN": "the remote stand-in's operator token (harness/remote)",
    "ORDERFLOW_REMOTE_ACCOUNTS": "the remote stand-in's accounts (harness/remote/accounts.py)",
    "ORDERFLOW_ENV_FILE": "the `.env` file the CLI reads its settings from (default: ./.env)",
}
"""`ORDERFLOW_*` variables that are read, but are no field of `Settings`."""


def passed_settings() -> list[str]:
    """The `ORDERFLOW_*` variables every orderflow container takes from `.env` or the shell."""
    return [
        f"ORDERFLOW_{name.upper()}"
        for _, names in LAYOUT
        for name in names
        if name not in SET_BY_COMPOSE
    ]


LAYOUT: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "where things are",
        (
            "rabbitmq_url",
            "store_url",
            "hub",
            "remote_url",
            "remote_port",
            "remote_account_key",
            "remote_fence_key",
            "broker_user_prefix",
            "seal_key",
        ),
    ),
    (
        "timeouts of every external call",
        (
            "connect_timeout_s",
            "store_command_timeout_s",
            "publish_timeout_s",
            "store_pool_size",
        ),
    ),
    (
        "the workflow",
        (
            "step_timeout_s",
            "retry_budget",
            "compensate_on",
            "workflow_version",
            "undo_attempts",
        ),
    ),
    (
        "the supervisor",
        (
            "supervisor_interval_s",
            "supervisor_scan_limit",
            "lease_ttl_s",
            "failure_threshold",
            "backoff_base_s",
            "backoff_cap_s",
            "cooldown_after",
            "cooldown_s",
        ),
    ),
    (
        "messaging",
        (
            "prefetch",
            "redelivery_limit",
            "max_message_bytes",
            "orders_queue_max_length",
            "inbox_ttl_s",
            "inbox_claim_ttl_s",
            "handler_timeout_s",
            "delayed_retries",
            "poison_alert_window_s",
            "intake_stall_s",
            "retry_delay_s",
            "outage_patience_s",
            "clock_skew_s",
        ),
    ),
    (
        "the agents",
        (
            "agent_attempts_per_request",
            "agent_http_timeout_s",
            "breaker_fail_max",
            "breaker_reset_s",
        ),
    ),
    (
        "the scheduler",
        (
            "scheduler_inflight",
            "claim_batch",
            "poll_interval_s",
            "drain_timeout_s",
        ),
    ),
    (
        "the submission process",
        (
            "backlog_threshold",
            "backlog_check_s",
        ),
    ),
    (
        "data retention",
        (
            "retention_s",
            "order_retention_s",
            "alert_retention_s",
            "retention_interval_s",
            "retention_batch",
            "alerts_queue_max_length",
        ),
    ),
    (
        "the supervisor (reporting)",
        ("stuck_pending_s",),
    ),
    (
        "observability: metrics, heartbeats, runtime alerts",
        (
            "metrics_port",
            "metrics_host",
            "heartbeat_s",
            "circuit_alert_after_s",
            "no_leader_alert_after_s",
        ),
    ),
    (
        "traces (shared/tracing.py): one per order, across processes; off unless exported",
        (
            "otlp_endpoint",
            "trace_file",
            "trace_sample_ratio",
        ),
    ),
    (
        "the notifier (`orderflow serve notifier`): alerts delivered to webhooks",
        (
            "notify_webhook_url",
            "notify_slack_url",
            "notify_pagerduty_routing_key",
            "notify_pagerduty_url",
            "notify_timeout_s",
            "notify_retry_max_s",
            "notify_give_up_after_s",
            "notify_poll_s",
        ),
    ),
    (
        "the HTTP API (`orderflow serve api`): the shop, the console, their API",
        (
            "api_host",
            "api_port",
            "api_record_wait_s",
            "api_stream_poll_s",
            "api_stream_max_s",
            "api_streams_per_token",
            "api_streams_max",
            "api_max_connections",
            "api_read_timeout_s",
            "api_rabbitmq_url",
            "api_operator_rabbitmq_url",
            "api_catalogue_path",
        ),
    ),
    (
        "the simulated remote service",
        (
            "remote_transient_error_rate",
            "remote_latency_ms",
            "remote_hang_rate",
            "remote_hang_s",
            "remote_decline_rate",
            "remote_outage",
            "remote_fail_operations",
            "remote_seed",
            "remote_ledger_path",
        ),
    ),
    (
        "fault injection (tests and drills; all off by default)",
        (
            "fault_duplicate_rate",
            "fault_reply_delay_rate",
            "fault_reply_delay_ms",
            "fault_seed",
            "fault_crash_at",
            "fault_crash_after",
        ),
    ),
    (
        "logging",
        ("log_level",),
    ),
)
"""`.env.example`'s headings and, under each, its settings in order (every field of
`shared.config.FIELDS` once: tests/unit/test_config.py checks it)."""


def _value(default: Any) -> str:
    if default is None:
        return ""
    if isinstance(default, bool):
        return str(default).lower()
    return str(default)


def _comment(text: str) -> list[str]:
    return [f"# {line.strip()}".rstrip() for line in text.strip().splitlines()]


def env_example() -> str:
    lines = [
        "# orderflow's docker compose deployment: copy this file to .env, write the secrets",
        "# (`sh infra/secrets.sh`; `sh infra/secrets.sh postgres` with COMPOSE_PROFILES=postgres)",
        "# then `docker compose up`. Compose reads .env itself; each container gets only the",
        "# ORDERFLOW_* settings from it, never this whole file. The `orderflow` command run in",
        "# this directory reads its ORDERFLOW_* lines too (the environment wins over them).",
        "# Generated by `orderflow deploy env-example` (`orderflow deploy write` regenerates every",
        "# deployment file): edit .env, not this file.",
        "",
        "# -- secrets: no password is in this file. Every password, token and connection URL is a",
        "# file in SECRETS_DIR (default ./secrets, never committed), handed to the containers",
        "# that need it as a compose secret (/run/secrets/...). infra/secrets.sh writes them.",
        "# SECRETS_DIR=./secrets",
        "",
        "# -- which store: profile `mongodb` runs MongoDB, `postgres` runs PostgreSQL instead",
        "# (write the secrets for the same one: `sh infra/secrets.sh postgres`).",
        "COMPOSE_PROFILES=mongodb",
        "",
        "# -- every orderflow setting, with its default: uncomment a line to change it",
    ]
    for heading, names in LAYOUT:
        lines += ["", f"# -- {heading}"]
        for name in names:
            field = FIELDS[name]
            lines += _comment(field.description or "")
            variable = f"ORDERFLOW_{name.upper()}"
            if name in SET_BY_COMPOSE:
                lines.append(f"# {variable}: set by docker-compose.yml ({SET_BY_COMPOSE[name]})")
            else:
                lines.append(f"# {variable}={_value(field.default)}")
    return "\n".join(lines) + "\n"


def compose_settings() -> str:
    """`infra/compose/settings.yml`, which every orderflow service `extends`."""
    header = (
        "# Generated by `orderflow deploy compose-settings` (`orderflow deploy write`): every\n"
        "# orderflow setting docker-compose.yml does not set itself. Without a value, compose\n"
        "# passes a variable on only when .env or the shell sets it; unset, the code's default.\n"
    )
    body = ["services:", "  settings:", "    environment:"]
    body += [f"      {variable}:" for variable in passed_settings()]
    return header + "\n".join(body) + "\n"
