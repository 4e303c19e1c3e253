"""Where things are (the hub, the store, the broker, the remote service), and what every
process shares."""

from __future__ import annotations

from urllib.parse import urlsplit

from pydantic import Field, SecretStr, field_validator, model_validator

from shared.broker.urls import broker_urls
from shared.config.base import STORE_SCHEMES, Section, check_port


class HubSettings(Section):
    """The task hub every process of a deployment shares (`Settings.hub`)."""

    hub: str = Field(default="orderflow", pattern=r"^[a-z][a-z0-9_]{0,39}$")
    """Task hub: prefixes every queue, exchange and database/schema."""


class StoreSettings(Section):
    """The store: which one, and the bounds on talking to it."""

    store_url: str = "mongodb://localhost:27017"
    """`mongodb://...` selects MongoDB, `postgresql://...` selects PostgreSQL (libpq's
    multi-host form too: with `postgresql://h1:5432,h2:5432/db?target_session_attrs=read-write`
    every process connects to the host that takes writes, and follows the writes to a promoted
    standby). Every URL printed has its user names and passwords masked (the userinfo,
    `password=` in the query, each URL of a list)."""
    store_command_timeout_s: float = Field(default=10.0, gt=0)
    """Upper bound on one store operation."""
    store_pool_size: int = Field(default=10, ge=1, le=200)
    """Connections per process to the store."""

    @field_validator("store_url")
    @classmethod
    def _known_store(cls, value: str) -> str:
        scheme = urlsplit(value).scheme
        if scheme not in STORE_SCHEMES:
            raise ValueError(f"store URL scheme {scheme!r} is not one of mongodb://, postgresql://")
        check_port(value)
        return value

    @property
    def store_kind(self) -> str:
        return STORE_SCHEMES[urlsplit(self.store_url).scheme]


class BrokerSettings(Section):
    """The broker: where it is, who a process is on it, how its queues and consumers behave."""

    rabbitmq_url: str = "amqp://guest:guest@localhost:5672/"
    """AMQP URL of the broker; or a comma-separated list of the URLs of a RabbitMQ cluster's
    nodes (the same user, password and virtual host in each): a process connects to one, from a
    random start, and fails over to the next when it loses it."""
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
    publish_timeout_s: float = Field(default=10.0, gt=0)
    """How long a publisher waits for the broker's confirm."""
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
    alerts_queue_max_length: int = Field(default=10_000, ge=1)
    """Alert notifications the queue `<hub>.alerts.feed` keeps for its reader (`orderflow
    alerts follow`); past this the oldest are dropped (every alert stays in the store for
    `orderflow alerts list`). Fixed when the queue is created."""

    @field_validator("rabbitmq_url")
    @classmethod
    def _amqp(cls, value: str) -> str:
        broker_urls(value)  # one URL, or a list of one cluster's nodes: shared/broker/urls.py
        return value

    @model_validator(mode="after")
    def _handler_fits_in_claim(self) -> BrokerSettings:
        if self.handler_timeout_s >= self.inbox_claim_ttl_s:
            raise ValueError(
                "ORDERFLOW_HANDLER_TIMEOUT_S must be below ORDERFLOW_INBOX_CLAIM_TTL_S, or a slow "
                "handler's message could be taken over and handled twice at once"
            )
        return self


MAX_CLOCK_SKEW_S = 3600
"""The most `clock_skew_s` may allow (and what MongoDB's TTL monitor waits past an expiry)."""


class ProcessSettings(Section):
    """What every process shares: how long it waits for a server, how far clocks may differ,
    how it drains."""

    connect_timeout_s: float = Field(default=5.0, gt=0)
    """How long to wait for a server when connecting."""
    clock_skew_s: float = Field(default=2.0, ge=0, le=MAX_CLOCK_SKEW_S)
    """How far apart the clocks of two hosts may be. Wherever one process judges a time another
    set (a step's deadline, a lease, an inbox claim), it allows this much before it acts: a
    supervisor ahead by less never recovers a live attempt, an agent behind by less never takes
    a request past its deadline for one still running."""
    drain_timeout_s: float = Field(default=10.0, gt=0)
    """On SIGTERM, how long a process lets the work in hand finish before it cancels it."""


class RemoteSettings(Section):
    """The remote service the agents call, and the keys its calls carry."""

    remote_url: str = "http://127.0.0.1:8080"
    """Base URL of the remote service the agents call."""
    remote_account_key: SecretStr | None = None
    """The key the agents call the remote service with: their account's (the hub's), sent as
    `Authorization: Bearer <key>` with every call; the remote refuses a call without it (401).
    A secret; `orderflow up` makes one when unset."""
    remote_fence_key: SecretStr | None = None
    """The key the schedulers sign every fencing token they send with (HMAC-SHA256), shared
    with the remote service, which refuses a token whose signature does not check: no one
    without it (the agents included) can advance an order's fence. A secret; `orderflow up`
    makes one when unset."""
