"""The one place where settings become concrete adapters."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from aio_pika.abc import AbstractRobustConnection

from shared.broker.connection import connect, quorum_available, server_version
from shared.broker.consumer import ConsumerPolicy
from shared.broker.topology import Names, QueuePolicy, declare_topology
from shared.config import Settings
from shared.store.factory import open_store
from shared.store.port import StateStore


def queue_policy(settings: Settings, connection: AbstractRobustConnection) -> QueuePolicy:
    return QueuePolicy(
        quorum=quorum_available(connection),
        delivery_limit=settings.redelivery_limit,
        orders_max_length=settings.orders_queue_max_length,
    )


def consumer_policy(settings: Settings) -> ConsumerPolicy:
    return ConsumerPolicy(
        prefetch=settings.prefetch,
        redelivery_limit=settings.redelivery_limit,
        max_message_bytes=settings.max_message_bytes,
        dedupe_window=timedelta(seconds=settings.inbox_ttl_s),
        claim_ttl=timedelta(seconds=settings.inbox_claim_ttl_s),
        handler_timeout=settings.handler_timeout_s,
    )


async def open_broker(settings: Settings, *, name: str) -> AbstractRobustConnection:
    return await connect(settings.rabbitmq_url, timeout=settings.connect_timeout_s, name=name)


@dataclass(frozen=True)
class InitReport:
    store_kind: str
    hub: str
    broker_version: str
    quorum: bool
    queues: list[str]


async def initialise(settings: Settings) -> InitReport:
    """Create the store's schema and indexes and declare the hub's topology. Idempotent."""
    store: StateStore = await open_store(settings)
    try:
        await store.init()
    finally:
        await store.close()
    connection = await open_broker(settings, name="orderflow-init")
    try:
        names = Names(settings.hub)
        policy = queue_policy(settings, connection)
        channel = await connection.channel()
        await declare_topology(channel, names, policy)
        queues = [q for base in names.input_queues() for q in (base, names.dlq(base))]
        return InitReport(
            store_kind=store.kind,
            hub=settings.hub,
            broker_version=server_version(connection),
            quorum=policy.quorum,
            queues=[*queues, names.alerts],
        )
    finally:
        await connection.close()
