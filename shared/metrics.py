"""Prometheus metrics (`orderflow_…`): one registry per process, served on its own port.

The metrics live in one process-wide registry (not prometheus-client's default one, so that
nothing registered by a library leaks in and tests read exactly these). A process serves it at
`http://ORDERFLOW_METRICS_HOST:ORDERFLOW_METRICS_PORT/metrics` (127.0.0.1 unless set: the
compose deployment sets 0.0.0.0 inside each container, for Prometheus on its network) once its
bootstrap calls `serve_metrics`; with the port 0 there is no endpoint and the metrics are only
counted in memory.

The same server answers `GET /healthz`: 200 while the process is up and its checks pass (its
broker connection is open, its store answers), 503 with the failing checks otherwise. It is what
`orderflow health` asks, the container healthcheck of every orderflow service.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from aiohttp import web
from prometheus_client import (
    CONTENT_TYPE_PLAIN_0_0_4,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    gc_collector,
    generate_latest,
    platform_collector,
    process_collector,
)

from shared.errors import ConfigurationError

log = logging.getLogger(__name__)

REGISTRY = CollectorRegistry()
process_collector.ProcessCollector(registry=REGISTRY)
platform_collector.PlatformCollector(registry=REGISTRY)
gc_collector.GCCollector(registry=REGISTRY)

# -- the supervisor leader (refreshed every round; cleared when leadership is lost, so that a sum
# over the supervisors counts each order once)
ORDERS = Gauge(
    "orderflow_orders",
    "Orders per process state (supervisor leader).",
    ["state"],
    registry=REGISTRY,
)
QUEUE_DEPTH = Gauge(
    "orderflow_queue_depth",
    "Messages ready in each input and dead-letter queue (supervisor leader).",
    ["queue"],
    registry=REGISTRY,
)
SUPERVISOR_LEADER = Gauge(
    "orderflow_supervisor_leader",
    "1 while this supervisor holds the leader lease.",
    registry=REGISTRY,
)
RECOVERIES = Counter(
    "orderflow_supervisor_recoveries",
    "Expired attempts recovered, by the state the order went to.",
    ["to"],
    registry=REGISTRY,
)
RETENTION_DELETED = Counter(
    "orderflow_retention_deleted",
    "Records the leader's retention purges deleted, by kind (orders: an order with its state).",
    ["record"],
    registry=REGISTRY,
)
RETENTION_BATCHES = Counter(
    "orderflow_retention_batches",
    "Bounded delete statements the leader's retention ran, by purge.",
    ["purge"],
    registry=REGISTRY,
)

# -- submission (its admission control: it pauses over the threshold)
BACKLOG = Gauge(
    "orderflow_backlog",
    "Outstanding orders (Pending or Processing) as submission's admission control last counted "
    "them, plus the orders recorded since.",
    registry=REGISTRY,
)
BACKLOG_THRESHOLD = Gauge(
    "orderflow_backlog_threshold",
    "ORDERFLOW_BACKLOG_THRESHOLD: over this backlog, submission stops taking orders.",
    registry=REGISTRY,
)
SUBMISSION_PAUSED = Gauge(
    "orderflow_submission_paused",
    "1 while submission has stopped taking orders (backlog over the threshold).",
    registry=REGISTRY,
)

# -- the scheduler
CLAIMS = Counter(
    "orderflow_claims",
    "Records claimed for a new attempt (forward) or to be compensated (compensation).",
    ["kind"],
    registry=REGISTRY,
)
INFLIGHT = Gauge("orderflow_inflight", "Attempts a scheduler runs right now.", registry=REGISTRY)
STEP_SECONDS = Histogram(
    "orderflow_step_seconds",
    "From sending a step request to its reply (requests whose deadline passed are not observed).",
    ["step", "action"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
    registry=REGISTRY,
)
STEP_OUTCOMES = Counter(
    "orderflow_step_outcomes",
    "Step requests by outcome: ok, error (a non-transient failure), deadline (no reply in time).",
    ["step", "action", "outcome"],
    registry=REGISTRY,
)

# -- the agents
AGENT_ATTEMPTS = Counter(
    "orderflow_agent_attempts",
    "Remote calls by outcome: ok, transient, permanent, fenced, or breaker_open (refused by an "
    "open circuit, no call made).",
    ["agent", "operation", "outcome"],
    registry=REGISTRY,
)
CIRCUIT_STATE = Gauge(
    "orderflow_circuit_state",
    "Circuit breaker per remote operation: 0 closed, 1 open, 2 half-open.",
    ["operation"],
    registry=REGISTRY,
)

# -- every consumer of an input queue
MESSAGES = Counter(
    "orderflow_messages",
    "Messages consumed, by outcome: handled, duplicate, dead_lettered, requeued, set_aside, "
    "held_return, cleaned.",
    ["queue", "outcome"],
    registry=REGISTRY,
)
DEAD_LETTERS = Counter(
    "orderflow_dead_letters",
    "Messages dead-lettered, by reason.",
    ["queue", "reason"],
    registry=REGISTRY,
)
REPLIES_DROPPED = Counter(
    "orderflow_replies_dropped",
    "Agent replies a scheduler dropped, by reason: unknown (late, or no request has its "
    "correlation id), unauthorised (not from the step's agent), mismatch (not about the "
    "request's step, action, attempt or idempotency key), not-a-reply.",
    ["reason"],
    registry=REGISTRY,
)


HealthCheck = Callable[[], Awaitable[dict[str, bool]]]
"""Named checks of a running process: each True when that part works."""


def exposition() -> bytes:
    """The registry in Prometheus's text format."""
    return generate_latest(REGISTRY)


class MetricsEndpoint:
    """`GET /metrics` (and `/healthz`) on one port of one address."""

    def __init__(self, runner: web.AppRunner, port: int) -> None:
        self._runner = runner
        self.port = port

    def set_health(self, check: HealthCheck) -> None:
        """What `/healthz` checks from now on (before: only that the process answers)."""
        self._runner.app[_HEALTH].check = check

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self._runner.cleanup()


class _Health:
    def __init__(self) -> None:
        self.check: HealthCheck | None = None


_HEALTH = web.AppKey("health", _Health)
HEALTH_TIMEOUT_S = 3.0
"""Upper bound on one health check (the container healthcheck's own timeout is longer)."""


async def _metrics(_: web.Request) -> web.Response:
    return web.Response(body=exposition(), headers={"Content-Type": CONTENT_TYPE_PLAIN_0_0_4})


async def _healthz(request: web.Request) -> web.Response:
    check = request.app[_HEALTH].check
    checks: dict[str, bool] = {}
    if check is not None:
        try:
            async with asyncio.timeout(HEALTH_TIMEOUT_S):
                checks = await check()
        except Exception as exc:  # a check that hangs or breaks is a failing check
            log.warning("health check failed", extra={"error": repr(exc)})
            checks = {"checks": False}
    healthy = all(checks.values())
    return web.json_response(
        {"status": "ok" if healthy else "failing", "checks": checks},
        status=200 if healthy else 503,
    )


async def serve_metrics(port: int, host: str = "127.0.0.1") -> MetricsEndpoint | None:
    """Start the endpoint on `host` (the loopback unless told: metrics and health are the
    host's business, not the network's); None when `port` is 0. A port in use is a
    configuration error."""
    if not port:
        return None
    app = web.Application()
    app[_HEALTH] = _Health()
    app.router.add_get("/metrics", _metrics)
    app.router.add_get("/healthz", _healthz)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
    except OSError as exc:
        await runner.cleanup()
        raise ConfigurationError(
            f"ORDERFLOW_METRICS_PORT: cannot listen on port {port}: {exc.strerror or exc}"
        ) from None
    log.info("metrics endpoint listening", extra={"metrics_host": host, "metrics_port": port})
    return MetricsEndpoint(runner, port)
