"""The edges' settings: observability, the notifier, the HTTP API; the remote stand-in's
simulation and the fault drills, which no production adapter reads."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, SecretStr, field_validator

from shared.broker.urls import broker_urls
from shared.config.base import Section


class ObservabilitySettings(Section):
    """Observability: metrics, heartbeats, runtime alerts, traces and logging."""

    metrics_port: int = Field(default=0, ge=0, le=65535)
    """Port of this process's Prometheus endpoint (`/metrics`); 0: none. `orderflow up
    --metrics-port N` gives its processes N, N+1, ... instead."""
    metrics_host: str = "127.0.0.1"
    """Address the metrics endpoint (and `/healthz`) listens on (`0.0.0.0` in a container,
    where Prometheus scrapes it over the compose network)."""
    heartbeat_s: float = Field(default=5.0, gt=0, le=3600)
    """How often a process reports its status (heartbeat); a status expires after three missed
    beats, and a clean stop removes it."""
    no_leader_alert_after_s: float = Field(default=60.0, gt=0)
    """Schedulers raise a `no-leader` alert when no supervisor has held the leader lease for
    longer than this; one alert per leaderless period."""
    otlp_endpoint: str = ""
    """OTLP/HTTP collector to send spans to (`http://jaeger:4318`: `/v1/traces` is added to a
    URL without a path); empty: none."""
    trace_file: str = ""
    """File to append spans to as JSON lines (several processes may share it); empty: none."""
    trace_sample_ratio: float = Field(default=1.0, ge=0, le=1)
    """Share of orders traced. The trace id is derived from the order id, so every process
    keeps or drops the same orders, each whole."""
    log_level: str = Field(default="INFO", pattern=r"^(?i:debug|info|warning|error|critical)$")
    """Python log level name."""
    log_format: Literal["auto", "text", "json"] = "auto"
    """How a process writes its log: `json`, one JSON object per line (for a log collector);
    `text`, one line a person reads per event (time, process, event, its fields); `auto`: text
    on a terminal, JSON otherwise (a pipe, a file, a container). `orderflow up` tells its
    processes its own choice."""


class NotifierSettings(Section):
    """The notifier (`orderflow serve notifier`): alerts delivered to webhooks."""

    notify_webhook_url: SecretStr | None = None
    """A generic JSON webhook each alert is POSTed to (the alert as JSON, with its `event`:
    trigger, acknowledge or resolve); unset: none. A secret (URLs often carry a token)."""
    notify_slack_url: SecretStr | None = None
    """A Slack (or Slack-compatible) incoming-webhook URL; unset: none. A secret."""
    notify_pagerduty_routing_key: SecretStr | None = None
    """The integration (routing) key of a PagerDuty Events API v2 service; unset: no PagerDuty.
    A secret."""
    notify_pagerduty_url: str = "https://events.pagerduty.com/v2/enqueue"
    """Where PagerDuty events are POSTed (the Events API v2 endpoint)."""
    notify_timeout_s: float = Field(default=10.0, gt=0, le=300)
    """Upper bound on one HTTP request to a target."""
    notify_retry_max_s: float = Field(default=60.0, gt=0)
    """Longest wait between two tries of a delivery (exponential backoff with jitter up to
    this; a 429's or 503's `Retry-After` is waited for instead, bounded by the give-up time)."""
    notify_give_up_after_s: float = Field(default=900.0, gt=0)
    """A delivery still failing after this long (connection refused, timeouts, 408, 429, 5xx)
    is given up and dead-lettered with its reason."""
    notify_poll_s: float = Field(default=5.0, gt=0, le=3600)
    """How often the notifier looks for alerts acknowledged or resolved since, to tell the
    targets (PagerDuty's `acknowledge` and `resolve`)."""


class ApiSettings(Section):
    """The HTTP API (`orderflow serve api`): the shop, the console, their API."""

    api_host: str = "127.0.0.1"
    """Address the API listens on (`0.0.0.0` in a container, published behind 127.0.0.1)."""
    api_port: int = Field(default=8000, ge=1, le=65535)
    """Port of the HTTP API, the shop and the operator console."""
    api_record_wait_s: float = Field(default=3.0, ge=0, le=60)
    """How long `POST /orders` waits for the order to be recorded before it answers 202
    Accepted instead of 201 Created (a conflict found in that time is a 409)."""
    api_stream_poll_s: float = Field(default=2.0, gt=0, le=60)
    """How often a live status stream reads its order again, besides the status messages that
    wake it (so a lost message, or a change nobody reports, is seen within this)."""
    api_stream_max_s: float = Field(default=300.0, gt=0, le=86_400)
    """A live status stream ends after this long, final or not; its client opens it again (SSE's
    `retry:` says when), so that no stream holds its place for ever."""
    api_streams_per_token: int = Field(default=10, ge=1)
    """Live status streams one API token may hold open at once; one more is refused (429)."""
    api_streams_max: int = Field(default=100, ge=1)
    """Live status streams the API serves at once, each reading the store every
    `ORDERFLOW_API_STREAM_POLL_S`; one more is refused (503). Keep it well below
    `ORDERFLOW_API_MAX_CONNECTIONS`."""
    api_max_connections: int = Field(default=512, ge=8)
    """Connections the API holds at once (uvicorn's `limit_concurrency`): past it, every request
    is answered 503 at once, so a flood of connections costs a refusal, not memory."""
    api_read_timeout_s: float = Field(default=10.0, gt=0, le=300)
    """A request must arrive within this: its head from its first byte (or from the connection's
    opening: a connection that sends nothing is closed), its body from its head (else 408)."""
    api_rabbitmq_url: str | None = None
    """AMQP URL (or list of a cluster's node URLs) of the API's own broker user (`<hub>-api` in
    the generated definitions), which its operator endpoints act as: it lists, replays and
    purges dead letters and reads queue depths, and nothing else (the compose deployment gives
    the API this and an application's user of its own as `ORDERFLOW_RABBITMQ_URL`); unset: the
    user of `ORDERFLOW_RABBITMQ_URL`."""
    api_operator_rabbitmq_url: str | None = None
    """No longer read: the API refuses to start while it is set. It gave the API the operator's
    broker user, which may also take the alert feed; set `ORDERFLOW_API_RABBITMQ_URL` to the
    URL of the API's own user (`<hub>-api`) instead."""
    api_catalogue_path: str | None = None
    """A JSON file of the shop's catalogue (`[{"sku", "name", "unit_price_cents"}, …]`);
    unset: a small built-in catalogue."""

    @field_validator("api_rabbitmq_url", "api_operator_rabbitmq_url")
    @classmethod
    def _amqp(cls, value: str | None) -> str | None:
        if value is None:
            return None
        broker_urls(value)  # one URL, or a list of one cluster's nodes: shared/broker/urls.py
        return value


class RemoteStandInSettings(Section):
    """The simulated remote service (harness/remote): read by the stand-in only."""

    remote_port: int | None = Field(default=None, ge=1, le=65535)
    """Port the simulated remote service (`orderflow serve remote`, and `orderflow up`'s
    `remote`) listens on; unset: the port of `ORDERFLOW_REMOTE_URL`. `orderflow up` points its
    agents at it."""
    remote_transient_error_rate: float = Field(default=0.0, ge=0, le=1)
    """Share of calls answered 503 before any effect."""
    remote_latency_ms: float = Field(default=0.0, ge=0)
    """Added to every call."""
    remote_hang_rate: float = Field(default=0.0, ge=0, le=1)
    """Share of calls that hang for `ORDERFLOW_REMOTE_HANG_S` before they apply (or are fenced
    off)."""
    remote_hang_s: float = Field(default=30.0, ge=0)
    """How long a hanging call hangs."""
    remote_decline_rate: float = Field(default=0.0, ge=0, le=1)
    """Share of orders whose payment is declined: permanent, the same for an order every time."""
    remote_outage: bool = False
    """When true every call fails with 503 (switchable at run time)."""
    remote_fail_operations: str = ""
    """Operations (comma-separated, e.g. `inventory.release`) that answer 503 until cleared."""
    remote_seed: int | None = None
    """Seed of the fault choices, for repeatable runs."""
    remote_ledger_path: str = "orderflow-remote-ledger.sqlite3"
    """The remote service's durable ledger of effects (SQLite)."""


class DrillSettings(Section):
    """Fault injection (tests and drills; all off by default). Read by the bootstrap only, which
    chooses the wrappers (shared/bootstrap.py)."""

    fault_duplicate_rate: float = Field(default=0.0, ge=0, le=1)
    """Share of published messages sent twice with the same message_id (duplicate delivery)."""
    fault_reply_delay_rate: float = Field(default=0.0, ge=0, le=1)
    """Share of agent replies held back by `ORDERFLOW_FAULT_REPLY_DELAY_MS` before they are
    sent."""
    fault_reply_delay_ms: float = Field(default=0.0, ge=0)
    """How long a held-back reply waits (longer than the step timeout: a late reply)."""
    fault_seed: int | None = None
    """Seed of the fault choices above."""
    fault_crash_at: str | None = Field(
        default=None,
        pattern=r"^(claim-uncommitted|after-claim|after-request|after-undo-request)$",
    )
    """Scheduler crash drill: exit at once, as `kill -9` would, at this point of its
    `ORDERFLOW_FAULT_CRASH_AFTER`-th attempt: `claim-uncommitted` (a claim made but not committed;
    PostgreSQL), `after-claim` (claimed, nothing else done), `after-request` (a step request
    out, its reply not recorded), `after-undo-request` (an undo request out)."""
    fault_crash_after: int = Field(default=1, ge=1)
    """Which attempt reaching `ORDERFLOW_FAULT_CRASH_AT` ends the scheduler (lets load build up
    first)."""
