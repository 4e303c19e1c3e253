"""Settings (DESIGN §2): read from the environment, prefix `ORDERFLOW_`, once, in a bootstrap.

`load_settings` also reads a `.env` file (the one docker compose reads), `.env` in the current
directory or the file `ORDERFLOW_ENV_FILE` names: only its `ORDERFLOW_*` lines, and a real
environment variable wins over the file's line. (The one way a URL is shown, credentials
masked, is `shared.masking.mask_credentials`.)
"""

from __future__ import annotations

import functools
import os
import random
from collections.abc import Mapping
from datetime import timedelta
from types import MappingProxyType
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from shared.broker.urls import broker_urls
from shared.domain.messages import validation_problems
from shared.domain.models import StateRecord
from shared.domain.states import ErrorKind
from shared.domain.timing import recovery_backoff
from shared.domain.updates import RecoveryPolicy
from shared.domain.workflow import WORKFLOWS, Workflow, current_workflow, get_workflow
from shared.errors import ConfigurationError

STORE_SCHEMES = {
    "mongodb": "mongodb",
    "mongodb+srv": "mongodb",
    "postgresql": "postgresql",
    "postgres": "postgresql",
}


class Settings(BaseSettings):
    """Every setting of every process. Field docs are the documented defaults (README)."""

    model_config = SettingsConfigDict(
        env_prefix="ORDERFLOW_",
        extra="ignore",
        frozen=True,
        use_attribute_docstrings=True,
        # `ORDERFLOW_X=` (as an uncommented .env.example line passes it) means the default.
        env_ignore_empty=True,
        # Compose secrets: the file `orderflow_rabbitmq_url` in this directory is
        # ORDERFLOW_RABBITMQ_URL (an environment variable still wins). Read only where
        # ORDERFLOW_SECRETS_DIR names one (the compose deployment: /run/secrets), so that nothing
        # warns of a missing directory elsewhere.
        secrets_dir=os.environ.get("ORDERFLOW_SECRETS_DIR") or None,
    )

    # -- where things are
    rabbitmq_url: str = "amqp://guest:guest@localhost:5672/"
    """AMQP URL of the broker; or a comma-separated list of the URLs of a RabbitMQ cluster's
    nodes (the same user, password and virtual host in each): a process connects to one, from a
    random start, and fails over to the next when it loses it."""
    store_url: str = "mongodb://localhost:27017"
    """`mongodb://...` selects MongoDB, `postgresql://...` selects PostgreSQL (libpq's
    multi-host form too: `postgresql://h1:5432,h2:5432/db?target_session_attrs=read-write`
    follows the writes to a promoted standby)."""
    hub: str = Field(default="orderflow", pattern=r"^[a-z][a-z0-9_]{0,39}$")
    """Task hub: prefixes every queue, exchange and database/schema."""
    remote_url: str = "http://127.0.0.1:8080"
    """Base URL of the remote service the agents call."""
    remote_port: int | None = Field(default=None, ge=1, le=65535)
    """Port the simulated remote service (`orderflow serve remote`, and `orderflow up`'s
    `remote`) listens on; unset: the port of `ORDERFLOW_REMOTE_URL`. `orderflow up` points its
    agents at it."""
    remote_account_key: SecretStr | None = None
    """The key the agents call the remote service with: their account's (the hub's), sent as
    `Authorization: Bearer <key>` with every call; the remote refuses a call without it (401).
    A secret; `orderflow up` makes one when unset."""
    remote_fence_key: SecretStr | None = None
    """The key the schedulers sign every fencing token they send with (HMAC-SHA256), shared
    with the remote service, which refuses a token whose signature does not check: no one
    without it (the agents included) can advance an order's fence. A secret; `orderflow up`
    makes one when unset."""
    broker_user_prefix: str | None = Field(default=None, max_length=60)
    """What each kind of process's RabbitMQ user name starts with (`<prefix>scheduler`,
    `<prefix>agent-payment`); unset: `<hub>-`, as the generated definitions name them. A
    receiver accepts a message only from the user allowed to send it (shared/broker/senders.py);
    a process whose own user does not follow this naming (one user for all, as `guest` in
    development) accepts messages only from that same user."""
    seal_key: SecretStr | None = None
    """Key of the seal a consumer puts on its dead letters (so that a replay is accepted as what
    it was, and nothing else is); unset: derived from the password of `ORDERFLOW_RABBITMQ_URL`
    (each kind of process has its own). Set it (the same for every process of a kind) to keep
    dead letters replayable across a password change, or when the broker URL has no password."""

    # -- timeouts of every external call
    connect_timeout_s: float = Field(default=5.0, gt=0)
    """How long to wait for a server when connecting."""
    store_command_timeout_s: float = Field(default=10.0, gt=0)
    """Upper bound on one store operation."""
    publish_timeout_s: float = Field(default=10.0, gt=0)
    """How long a publisher waits for the broker's confirm."""
    store_pool_size: int = Field(default=10, ge=1, le=200)
    """Connections per process to the store."""

    # -- the workflow
    step_timeout_s: float = Field(default=10.0, gt=0)
    """A step's `complete_by` is its start plus this."""
    retry_budget: int = Field(default=12, ge=1, le=1000)
    """Remote attempts an order may spend end to end (agent retries and recoveries)."""

    compensate_on: str | None = Field(default=None, max_length=1000)
    """Error kinds that compensate rather than park in Error, for every workflow
    (`permanent,budget-exhausted`) or per workflow (`order=permanent,recovery-limit;other=`);
    kinds: `permanent`, `budget-exhausted`, `recovery-limit`. A workflow not named keeps its own
    policy (the order workflow compensates `permanent`: a declined payment)."""
    workflow_version: int | None = Field(default=None, ge=1)
    """Version of the order workflow that new orders start on (a staged rollout); unset: this
    build's current version. Orders already started always finish on their own version."""
    undo_attempts: int = Field(default=3, ge=1, le=100)
    """Remote attempts one undo request may spend; an undo still failing after them makes the
    order CompensationFailed (undos do not draw on the order's retry budget)."""

    # -- the supervisor
    supervisor_interval_s: float = Field(default=2.0, gt=0)
    """Time between two scans for expired steps."""
    supervisor_scan_limit: int = Field(default=500, ge=1, le=100_000)
    """Records one scan page returns."""
    lease_ttl_s: float = Field(default=10.0, gt=0)
    """Leader lease period: a dead leader is replaced within it."""
    failure_threshold: int = Field(default=5, ge=1)
    """Recoveries of one order before the supervisor parks it in Error."""
    backoff_base_s: float = Field(default=0.5, gt=0)
    """First recovery's delay before the order may be claimed again (doubles each time)."""
    backoff_cap_s: float = Field(default=30.0, gt=0)
    """Largest exponential recovery delay."""
    cooldown_after: int = Field(default=3, ge=1)
    """Past this many failures an order rests for the cool-down instead."""
    cooldown_s: float = Field(default=60.0, gt=0)
    """The longer rest after repeated failures."""

    # -- messaging
    prefetch: int = Field(default=32, ge=1, le=10_000)
    """Unacknowledged messages a consumer holds at once."""
    redelivery_limit: int = Field(default=5, ge=1, le=1000)
    """Deliveries of one message before it is dead-lettered."""
    max_message_bytes: int = Field(default=64 * 1024, ge=1024)
    """Larger bodies are dead-lettered unread."""
    orders_queue_max_length: int = Field(default=10_000, ge=1)
    """Admission control: publishers are refused beyond this backlog on `<hub>.orders`."""
    inbox_ttl_s: float = Field(default=24 * 3600.0, gt=0)
    """Duplicate-detection window: a message id seen within it is handled once."""
    inbox_claim_ttl_s: float = Field(default=30.0, gt=0)
    """How long a consumer's claim on a message id lasts before another may take it over."""
    handler_timeout_s: float = Field(default=20.0, gt=0)
    """Upper bound on handling one message (keep it below the inbox claim TTL)."""
    delayed_retries: int = Field(default=3, ge=0, le=100)
    """Times a message whose handling failed unexpectedly (not an outage, not a refusal) is set
    aside in its queue's retry queue and tried again; then it is dead-lettered
    (`retries-exhausted`) with the last error."""
    poison_alert_window_s: float = Field(default=60.0, ge=0)
    """After a `poison-message` alert, further dead letters of the same queue and reason are
    counted instead of alerted for this long; the next alert carries the count (0: an alert for
    every dead letter)."""
    intake_stall_s: float = Field(default=60.0, gt=0)
    """A consumer that has taken no message for this long while its queue has ready ones is
    reported `stalled` (heartbeat, `/healthz`, `orderflow stats`)."""
    retry_delay_s: float = Field(default=10.0, gt=0, le=24 * 3600)
    """How long a message set aside waits in the retry queue before it comes back (the
    messages behind it go on meanwhile)."""
    outage_patience_s: float = Field(default=300.0, gt=0, le=24 * 3600)
    """How long a message is held, retried in place, while a server it needs (the store, the
    broker) is unavailable; past it the message goes back to its queue, to the end, without
    counting as a delivery (an outage is never a message's fault, however long). The same for
    a scheduler's step request the broker refuses: the order is held, its deadline kept ahead,
    for as long as the outage lasts (this says when the wait is logged as an error)."""
    clock_skew_s: float = Field(default=2.0, ge=0, le=3600)
    """How far apart the clocks of two hosts may be. Wherever one process judges a time another
    set (a step's deadline, a lease, an inbox claim), it allows this much before it acts: a
    supervisor ahead by less never recovers a live attempt, an agent behind by less never takes
    a request past its deadline for one still running."""

    # -- the agents
    agent_attempts_per_request: int = Field(default=3, ge=1, le=100)
    """Remote attempts one step request may spend (never more than the order's budget left)."""
    agent_http_timeout_s: float = Field(default=5.0, gt=0)
    """Upper bound on one HTTP call to the remote service (the deadline may cut it shorter)."""
    breaker_fail_max: int = Field(default=10, ge=1)
    """Consecutive transient failures of one remote endpoint that open its circuit breaker
    (high enough that a 20% error rate does not trip it: 0.2^10 is one in ten million)."""
    breaker_reset_s: float = Field(default=5.0, gt=0)
    """How long an open circuit fails fast before it lets one trial call through."""

    # -- the scheduler
    scheduler_inflight: int = Field(default=200, ge=1, le=100_000)
    """Orders one scheduler process runs at once."""
    claim_batch: int = Field(default=50, ge=1, le=10_000)
    """Records one claim takes at most."""
    poll_interval_s: float = Field(default=0.2, gt=0)
    """How long an idle starter waits before it looks for claimable records again."""
    drain_timeout_s: float = Field(default=10.0, gt=0)
    """On SIGTERM, how long a process lets the work in hand finish before it cancels it."""

    # -- the submission process
    backlog_threshold: int = Field(default=5000, ge=1)
    """Submission stops taking orders while Pending + Processing exceeds this."""
    backlog_check_s: float = Field(default=1.0, gt=0)
    """How often submission counts the outstanding backlog."""

    # -- data retention
    retention_s: float = Field(default=30 * 24 * 3600.0, gt=0)
    """History and compensation records of a finished order (Processed, Compensated or
    Cancelled) are deleted this long after it finished (the order and its state record stay
    until `order_retention_s`)."""
    order_retention_s: float = Field(default=90 * 24 * 3600.0, gt=0)
    """A finished order (Processed, Compensated or Cancelled) is deleted, its order record,
    state record and journal together, this long after it finished; parked (Error,
    CompensationFailed) and live orders never are. A submission of its id after that is a new
    order."""
    alert_retention_s: float = Field(default=90 * 24 * 3600.0, gt=0)
    """Stored alerts are deleted this long after they were raised."""
    retention_interval_s: float = Field(default=600.0, gt=0)
    """How often the supervisor leader purges what expired: inbox entries past the dedupe
    window, journals, finished orders and alerts past their retention (while a purge finds
    full batches, it goes on every supervisor round instead)."""
    retention_batch: int = Field(default=1000, ge=1, le=100_000)
    """Records one purge statement deletes at most (a few such batches per supervisor round),
    so that no delete holds up recovery or the store for long."""
    alerts_queue_max_length: int = Field(default=10_000, ge=1)
    """Alert notifications the queue `<hub>.alerts.feed` keeps for its reader (`orderflow
    alerts follow`); past this the oldest are dropped (every alert stays in the store for
    `orderflow alerts list`). Fixed when the queue is created."""

    # -- the supervisor (reporting)
    stuck_pending_s: float = Field(default=300.0, gt=0)
    """A Pending record due for longer than this is reported as stuck."""

    # -- observability: metrics, heartbeats, runtime alerts
    metrics_port: int = Field(default=0, ge=0, le=65535)
    """Port of this process's Prometheus endpoint (`/metrics`); 0: none. `orderflow up
    --metrics-port N` gives its processes N, N+1, ... instead."""
    metrics_host: str = "127.0.0.1"
    """Address the metrics endpoint (and `/healthz`) listens on (`0.0.0.0` in a container,
    where Prometheus scrapes it over the compose network)."""
    heartbeat_s: float = Field(default=5.0, gt=0, le=3600)
    """How often a process reports its status (heartbeat); a status expires after three missed
    beats, and a clean stop removes it."""
    circuit_alert_after_s: float = Field(default=30.0, gt=0)
    """An agent raises a `circuit-open` alert when a circuit breaker has stayed open (failing
    trial calls included) longer than this; one alert per opening."""
    no_leader_alert_after_s: float = Field(default=60.0, gt=0)
    """Schedulers raise a `no-leader` alert when no supervisor has held the leader lease for
    longer than this; one alert per leaderless period."""

    # -- traces (shared/tracing.py): one per order, across processes; off unless exported
    otlp_endpoint: str = ""
    """OTLP/HTTP collector to send spans to (`http://jaeger:4318`: `/v1/traces` is added to a
    URL without a path); empty: none."""
    trace_file: str = ""
    """File to append spans to as JSON lines (several processes may share it); empty: none."""
    trace_sample_ratio: float = Field(default=1.0, ge=0, le=1)
    """Share of orders traced. The trace id is derived from the order id, so every process
    keeps or drops the same orders, each whole."""

    # -- the notifier (`orderflow serve notifier`): alerts delivered to webhooks
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

    # -- the HTTP API (`orderflow serve api`): the shop, the console, their API
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
    `api_stream_poll_s`; one more is refused (503). Keep it well below `api_max_connections`."""
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

    # -- the simulated remote service
    remote_transient_error_rate: float = Field(default=0.0, ge=0, le=1)
    """Share of calls answered 503 before any effect."""
    remote_latency_ms: float = Field(default=0.0, ge=0)
    """Added to every call."""
    remote_hang_rate: float = Field(default=0.0, ge=0, le=1)
    """Share of calls that hang for `remote_hang_s` before they apply (or are fenced off)."""
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

    # -- fault injection (tests and drills; all off by default)
    fault_duplicate_rate: float = Field(default=0.0, ge=0, le=1)
    """Share of published messages sent twice with the same message_id (duplicate delivery)."""
    fault_reply_delay_rate: float = Field(default=0.0, ge=0, le=1)
    """Share of agent replies held back by `fault_reply_delay_ms` before they are sent."""
    fault_reply_delay_ms: float = Field(default=0.0, ge=0)
    """How long a held-back reply waits (longer than the step timeout: a late reply)."""
    fault_seed: int | None = None
    """Seed of the fault choices above."""
    fault_crash_at: str | None = Field(
        default=None,
        pattern=r"^(claim-uncommitted|after-claim|after-request|after-undo-request)$",
    )
    """Scheduler crash drill: exit at once, as `kill -9` would, at this point of its
    `fault_crash_after`-th attempt: `claim-uncommitted` (a claim made but not committed;
    PostgreSQL), `after-claim` (claimed, nothing else done), `after-request` (a step request
    out, its reply not recorded), `after-undo-request` (an undo request out)."""
    fault_crash_after: int = Field(default=1, ge=1)
    """Which attempt reaching `fault_crash_at` ends the scheduler (lets load build up first)."""

    # -- logging
    log_level: str = Field(default="INFO", pattern=r"^(?i:debug|info|warning|error|critical)$")
    """Python log level name."""

    @field_validator("compensate_on")
    @classmethod
    def _error_kinds(cls, value: str | None) -> str | None:
        if value is not None:
            _compensation_policies(value)
        return value

    @field_validator("workflow_version")
    @classmethod
    def _registered_version(cls, value: int | None) -> int | None:
        if value is not None:
            current_workflow("order", value)  # raises ValueError naming the registered ones
        return value

    @model_validator(mode="after")
    def _handler_fits_in_claim(self) -> Settings:
        if self.handler_timeout_s >= self.inbox_claim_ttl_s:
            raise ValueError(
                "ORDERFLOW_HANDLER_TIMEOUT_S must be below ORDERFLOW_INBOX_CLAIM_TTL_S, or a slow "
                "handler's message could be taken over and handled twice at once"
            )
        if self.inbox_claim_ttl_s < self.step_timeout_s:
            # A step request redelivered after its agent died is then taken over only once its
            # deadline has passed, when an agent makes no call: no allowance is spent twice.
            raise ValueError(
                "ORDERFLOW_INBOX_CLAIM_TTL_S must be at least ORDERFLOW_STEP_TIMEOUT_S, or a step "
                "request redelivered after its agent died could spend its allowance again"
            )
        return self

    @field_validator("store_url")
    @classmethod
    def _known_store(cls, value: str) -> str:
        scheme = urlsplit(value).scheme
        if scheme not in STORE_SCHEMES:
            raise ValueError(f"store URL scheme {scheme!r} is not one of mongodb://, postgresql://")
        _check_port(value)
        return value

    @field_validator("rabbitmq_url", "api_rabbitmq_url", "api_operator_rabbitmq_url")
    @classmethod
    def _amqp(cls, value: str | None) -> str | None:
        if value is None:
            return None
        broker_urls(value)  # one URL, or a list of one cluster's nodes: shared/broker/urls.py
        return value

    @property
    def store_kind(self) -> str:
        return STORE_SCHEMES[urlsplit(self.store_url).scheme]

    @property
    def step_timeout(self) -> timedelta:
        return timedelta(seconds=self.step_timeout_s)

    def compensates(self, workflow: Workflow, kind: ErrorKind) -> bool:
        """Whether a failure of this kind compensates the workflow's completed steps (else the
        order is parked in Error for an operator)."""
        if self.compensate_on is None:
            return workflow.compensates(kind)
        policies = _compensation_policies(self.compensate_on)  # parsed once per value
        override = policies.get(workflow.name, policies.get(None))
        return workflow.compensates(kind, override)

    def recovery_policy(self, rng: random.Random | None = None) -> RecoveryPolicy:
        """When a recovered order may be claimed again, and what happens at the threshold.
        `rng` draws the jitter; None: the process's `random` (which a simulation seeds)."""

        def compensate_at_limit(record: StateRecord) -> bool:
            workflow = get_workflow(record.workflow, record.workflow_version)
            return workflow is not None and self.compensates(workflow, ErrorKind.RECOVERY_LIMIT)

        return RecoveryPolicy(
            failure_threshold=self.failure_threshold,
            backoff=lambda failures: recovery_backoff(
                failures,
                base=timedelta(seconds=self.backoff_base_s),
                cap=timedelta(seconds=self.backoff_cap_s),
                cooldown_after=self.cooldown_after,
                cooldown=timedelta(seconds=self.cooldown_s),
                rng=rng,
            ),
            compensate_at_limit=compensate_at_limit,
        )


COMPENSABLE = (ErrorKind.PERMANENT, ErrorKind.BUDGET_EXHAUSTED, ErrorKind.RECOVERY_LIMIT)
"""The failures that end an attempt for good, which a workflow may compensate or park."""


@functools.cache
def _compensation_policies(value: str) -> Mapping[str | None, frozenset[ErrorKind]]:
    """`kind,kind` (every workflow) or `name=kind,kind;name=...` (per workflow; an empty list
    parks every failure), keyed by workflow name, None for every workflow."""
    known = {kind.value: kind for kind in COMPENSABLE}
    names = {workflow.name for workflow in WORKFLOWS}
    policies: dict[str | None, frozenset[ErrorKind]] = {}
    for part in value.split(";"):
        name, equals, kinds = part.strip().rpartition("=")
        key = name.strip() if equals else None
        if key is not None and key not in names:
            raise ValueError(f"{key!r} is not a workflow: {', '.join(sorted(names))}")
        if key in policies:
            raise ValueError(f"workflow {key or '(every)'} is given twice")
        chosen = [kind.strip() for kind in kinds.split(",") if kind.strip()]
        for kind in chosen:
            if kind not in known:
                raise ValueError(f"{kind!r} cannot compensate: {', '.join(known)}")
        policies[key] = frozenset(known[kind] for kind in chosen)
    return MappingProxyType(policies)


def _check_port(url: str) -> None:
    for host in urlsplit(url).netloc.rpartition("@")[2].split(","):
        _, colon, port = host.rpartition(":")
        if colon and not port.isdigit():
            raise ValueError(f"port {port!r} is not a number")


ENV_FILE_VARIABLE = "ORDERFLOW_ENV_FILE"
DEFAULT_ENV_FILE = ".env"


def env_file() -> str | None:
    """The `.env` file the settings are read from: `ORDERFLOW_ENV_FILE`'s (which must exist),
    else `.env` in the current directory if there is one, else none."""
    named = os.environ.get(ENV_FILE_VARIABLE)
    if named:
        if not os.path.isfile(named):
            raise ConfigurationError(f"{ENV_FILE_VARIABLE}: no file {named!r}")
        return named
    return DEFAULT_ENV_FILE if os.path.isfile(DEFAULT_ENV_FILE) else None


def load_settings(**overrides: object) -> Settings:
    """Read the environment (and the `.env` file) once; a bad value becomes a one-line
    `ConfigurationError`."""
    try:
        # extra="ignore": the file's other keys (compose's own, COMPOSE_PROFILES, SECRETS_DIR)
        # are not read; the environment wins over the file (pydantic-settings' order).
        return Settings(_env_file=env_file(), **overrides)  # type: ignore[arg-type]
    except ValidationError as exc:
        loc, msg = validation_problems(exc)[0]
        field = ".".join(str(p) for p in loc)
        env = f"ORDERFLOW_{field.upper()}" if field else "settings"
        message = msg.removeprefix("Value error, ")
        raise ConfigurationError(f"{env}: {message}") from None
