"""The one place where settings become concrete adapters."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from shared import crash
from shared.broker.consumer import Consumer, ConsumerPolicy, Delivery, Handler
from shared.broker.dedupe import AlongClaim
from shared.broker.delivery import INTAKE_HEALTHY
from shared.broker.drills import Drills, drilled
from shared.broker.port import Connection, QueueAdmin
from shared.broker.publisher import Publisher, Publishing
from shared.broker.rabbitmq import connect
from shared.broker.seal import seal_key
from shared.broker.senders import Senders
from shared.broker.topology import (
    Names,
    QueuePolicy,
    declare_topology,
    retire_unbounded_alerts_queue,
    supports_quorum,
)
from shared.broker.urls import login_user
from shared.config import DrillSettings, Settings
from shared.errors import ConfigurationError
from shared.heartbeat import Check, Heartbeat, StatusData
from shared.metrics import MetricsEndpoint, serve_metrics
from shared.reporting import PoisonAlerts, Reporter
from shared.store.factory import open_store
from shared.store.port import StateStore

if TYPE_CHECKING:
    from shared.store.postgres import BeforeClaimCommit

log = logging.getLogger(__name__)

BURST_POLL_S = 0.1
"""How often a process in burst mode looks whether it has anything left to do."""
INTAKE_CHECK_S = 2.0
"""Upper bound on reading one consumer's intake (within /healthz's own bound)."""


def queue_policy(settings: Settings, connection: Connection) -> QueuePolicy:
    if not supports_quorum(connection.info.version):
        # Classic queues report only "redelivered", not how often: the redelivery limit (and
        # with it the end-to-end retry budget) could not be enforced.
        raise ConfigurationError(
            f"RabbitMQ {connection.info.version} is older than 3.10: orderflow needs quorum "
            "queues that count a failing message's deliveries and hold its delayed retries "
            "(message TTL, at-least-once dead-lettering)"
        )
    return QueuePolicy(
        quorum=True,
        delivery_limit=settings.broker.redelivery_limit,
        orders_max_length=settings.broker.orders_queue_max_length,
        alerts_max_length=settings.broker.alerts_queue_max_length,
    )


def consumer_policy(settings: Settings) -> ConsumerPolicy:
    return ConsumerPolicy(
        prefetch=settings.broker.prefetch,
        redelivery_limit=settings.broker.redelivery_limit,
        max_message_bytes=settings.broker.max_message_bytes,
        dedupe_window=timedelta(seconds=settings.broker.inbox_ttl_s),
        claim_ttl=timedelta(seconds=settings.broker.inbox_claim_ttl_s),
        handler_timeout=settings.broker.handler_timeout_s,
        delayed_retries=settings.broker.delayed_retries,
        retry_delay=settings.broker.retry_delay_s,
        outage_patience=settings.broker.outage_patience_s,
        clock_skew=timedelta(seconds=settings.process.clock_skew_s),
        own_user=login_user(settings.broker.rabbitmq_url),
        user_prefix=settings.broker.broker_user_prefix,
        seal_key=seal_key(settings.broker),
    )


async def connect_store(settings: Settings, *, initialising: bool = False) -> StateStore:
    """The store the settings name, with the crash drill's hook in its claims when asked
    (`initialising`: for `orderflow init`, see `open_store`)."""
    return await open_store(
        settings.store,
        settings.hub,
        connect_timeout_s=settings.process.connect_timeout_s,
        before_claim_commit=claim_drill(settings.drills),
        initialising=initialising,
    )


def claim_drill(drills: DrillSettings) -> BeforeClaimCommit | None:
    """The crash drill's hook in a PostgreSQL claim, when the drills ask for it.

    Only for `claim-uncommitted`: the claim then runs in a transaction, and the hook exits the
    process inside it once the scheduler process armed the drill (`arm_crash_drill`, as it
    starts) and its count is reached; in any other process it does nothing. Otherwise there is
    no hook and a claim is one autocommitted statement, as in production."""
    if drills.fault_crash_at != "claim-uncommitted":
        return None
    return crash.claim_uncommitted


def arm_crash_drill(drills: DrillSettings) -> None:
    """Arm the scheduler's crash drill (shared/crash.py) as the drills ask: only a scheduler
    process calls this, as it starts; every other process leaves the drill inert."""
    crash.arm(drills.fault_crash_at, drills.fault_crash_after)


async def open_broker(settings: Settings, *, name: str) -> Connection:
    return await connect(
        settings.broker.rabbitmq_url, timeout=settings.process.connect_timeout_s, name=name
    )


def fault_drills(drills: DrillSettings) -> Drills:
    """The publisher's fault drills the settings ask for (none by default)."""
    return Drills(
        duplicate_rate=drills.fault_duplicate_rate,
        reply_delay_rate=drills.fault_reply_delay_rate,
        reply_delay_s=drills.fault_reply_delay_ms / 1000,
        seed=drills.fault_seed,
    )


async def open_publisher(settings: Settings, connection: Connection) -> Publishing:
    """A confirming publisher on `connection`, wrapped in the fault drills (shared/broker/
    drills.py) only when a drill's setting is non-zero."""
    publisher = await Publisher.open(connection, timeout=settings.broker.publish_timeout_s)
    return drilled(publisher, fault_drills(settings.drills))


@dataclass
class Runtime:
    """What a running process holds: its settings, its connections and its metrics endpoint."""

    settings: Settings
    name: str
    store: StateStore
    connection: Connection
    publisher: Publishing
    names: Names
    metrics: MetricsEndpoint | None = None
    consumers: list[Consumer] = field(default_factory=list)
    intake: list[dict[str, Any]] = field(default_factory=list)
    """The consumers' intake as last checked (each beat, and each `/healthz`)."""
    _probe: QueueAdmin | None = None
    _burst: asyncio.Task[None] | None = None

    @classmethod
    async def open(cls, settings: Settings, name: str) -> Runtime:
        store = await connect_store(settings)
        try:
            connection = await open_broker(settings, name=name)
        except BaseException:
            await store.close()
            raise
        try:
            metrics = await serve_metrics(
                settings.observability.metrics_port, settings.observability.metrics_host
            )
            return await cls.on(settings, name, store, connection, metrics=metrics)
        except BaseException:
            with contextlib.suppress(Exception):
                await connection.close()
            await store.close()
            raise

    @classmethod
    async def on(
        cls,
        settings: Settings,
        name: str,
        store: StateStore,
        connection: Connection,
        *,
        metrics: MetricsEndpoint | None = None,
    ) -> Runtime:
        """A runtime on a store and a broker connection already open (the memory adapters of
        a simulation or a test, or the real ones `open` connects)."""
        publisher = await open_publisher(settings, connection)
        runtime = cls(settings, name, store, connection, publisher, Names(settings.hub), metrics)
        if metrics is not None:
            metrics.set_health(runtime.health)
        return runtime

    async def health(self) -> dict[str, bool]:
        """`/healthz`: the broker connection is up (a robust connection clears `connected`
        while it reconnects), the store answers a ping, and every consumer is taking messages
        (or paused on purpose: see `Consumer.intake`)."""
        try:
            await self.store.ping()
            store = True
        except Exception:
            store = False
        checks = {"broker": self.connection.connected, "store": store}
        if self.consumers:
            await self.refresh_intake()
            checks["intake"] = all(i["state"] in INTAKE_HEALTHY for i in self.intake)
        return checks

    async def refresh_intake(self) -> None:
        stall = self.settings.broker.intake_stall_s
        self.intake = [await self._intake_of(c, stall) for c in self.consumers]
        for status in self.intake:
            # Before its consumers start (the first heartbeat is written first) a process is
            # starting, not stalled: the heartbeat says `not-started`, the log stays quiet.
            if status["state"] not in INTAKE_HEALTHY and status["state"] != "not-started":
                log.warning("a consumer is not taking messages", extra={"intake": status})

    async def _intake_of(self, consumer: Consumer, stall_after_s: float) -> dict[str, Any]:
        """One consumer's intake, bounded in time: a robust channel waits for its connection
        to come back without a timeout of its own, and the heartbeat and `/healthz` must not."""
        down = {"queue": consumer.queue, "state": "not-subscribed", "ready": None}
        if not self.connection.connected:
            return down | {"in_hand": consumer.in_hand, "idle_s": None}
        try:
            async with asyncio.timeout(INTAKE_CHECK_S):
                ready = await self._ready(consumer.queue)
                return await consumer.intake(ready=ready, stall_after_s=stall_after_s)
        except TimeoutError:
            return down | {"in_hand": consumer.in_hand, "idle_s": None}

    async def _ready(self, queue: str) -> int | None:
        """A queue's ready messages, on a probe channel of this process's own (None: unknown:
        gone, or the broker unreachable; the adapter opens a new channel for the next)."""
        try:
            if self._probe is None:
                self._probe = await self.connection.admin()
            return await self._probe.depth(queue)
        except Exception:
            return None

    def burst(self, stop: asyncio.Event, *, poll_s: float = BURST_POLL_S) -> asyncio.Task[None]:
        """Burst mode for a consuming process: a task that sets `stop` once there is nothing
        left to do, now or later: its consumers hold nothing, and their queues and retry
        queues nothing either (twice in a row, `poll_s` apart). The process then drains and
        returns, as on SIGTERM."""
        self._burst = asyncio.create_task(self._until_idle(stop, poll_s), name=f"burst:{self.name}")
        return self._burst

    async def _until_idle(self, stop: asyncio.Event, poll_s: float) -> None:
        quiet = 0
        while not stop.is_set() and quiet < 2:
            await asyncio.sleep(poll_s)
            quiet = quiet + 1 if await self._idle() else 0
        stop.set()

    async def _idle(self) -> bool:
        for consumer in self.consumers:
            if consumer.in_hand:
                return False
            for queue in (consumer.queue, self.names.retry(consumer.queue)):
                if await self._ready(queue) != 0:  # None (unknown) is not idle either
                    return False
        return True

    def senders(self, role: str) -> Senders:
        """Who this process, of kind `role`, tells apart (shared/broker/senders.py)."""
        return Senders.of(
            self.settings.hub,
            self.settings.broker.broker_user_prefix,
            login_user(self.settings.broker.rabbitmq_url),
            role,
        )

    def reporter(self) -> Reporter:
        return Reporter(self.store, self.publisher, self.names, self.name)

    def heartbeat(self, kind: str, data: StatusData, checks: tuple[Check, ...] = ()) -> Heartbeat:
        """This process's status, reported every `heartbeat_s` while the returned context runs;
        with its consumers' intake when it has any."""

        def status() -> dict[str, Any]:
            return {**data(), "intake": self.intake} if self.consumers else data()

        return Heartbeat(
            self.store,
            name=self.name,
            kind=kind,
            every_s=self.settings.observability.heartbeat_s,
            metrics_port=self.settings.observability.metrics_port,
            data=status,
            checks=checks,
            prepare=self.refresh_intake if self.consumers else None,
        )

    async def consumer(
        self,
        queue: str,
        handler: Handler,
        *,
        dedupe: bool = True,
        along: Callable[[Delivery], Sequence[AlongClaim]] | None = None,
    ) -> Consumer:
        reporter = self.reporter()
        consumer = Consumer(
            connection=self.connection,
            queue=queue,
            names=self.names,
            handler=handler,
            store=self.store if dedupe else None,
            dead_letter_publisher=self.publisher,
            policy=consumer_policy(self.settings),
            holder=self.name,
            on_poison=PoisonAlerts(
                reporter, queue, window_s=self.settings.broker.poison_alert_window_s
            ),
            along=along,
        )
        self.consumers.append(consumer)
        return consumer

    async def close(self) -> None:
        if self.metrics is not None:
            await self.metrics.close()
        with contextlib.suppress(Exception):
            await self.connection.close()
        with contextlib.suppress(Exception):
            await self.store.close()


@dataclass(frozen=True)
class InitReport:
    store_kind: str
    hub: str
    broker_version: str
    quorum: bool
    queues: list[str]
    retired_alerts: int = 0
    """Notifications in the unbounded alerts queue of an older release, deleted with it."""


async def initialise(settings: Settings) -> InitReport:
    """Create the store's schema and indexes and declare the hub's topology. Idempotent."""
    store: StateStore = await connect_store(settings, initialising=True)
    try:
        await store.init()
    finally:
        await store.close()
    connection = await open_broker(settings, name="orderflow-init")
    try:
        names = Names(settings.hub)
        policy = queue_policy(settings, connection)
        admin = await connection.admin()
        await declare_topology(admin, names, policy)
        retired = await retire_unbounded_alerts_queue(admin, names)
        queues = [q for base in names.input_queues() for q in (base, names.dlq(base))]
        return InitReport(
            store_kind=store.kind,
            hub=settings.hub,
            broker_version=connection.info.version,
            quorum=policy.quorum,
            queues=[*queues, names.alert_feed],
            retired_alerts=retired,
        )
    finally:
        await connection.close()
