"""Alerts for the operator: those stored (`orderflow alerts list`), and the notifications of
`<hub>.alerts.feed`, the bounded hand-off of alert notifications to their reader.

Every alert is stored (`orderflow alerts list` reads the store) and published on the fanout
exchange `<hub>.alerts`, whose queue `<hub>.alerts.feed` keeps the newest
`ORDERFLOW_ALERTS_QUEUE_MAX_LENGTH` of them until a reader takes them: `orderflow alerts
follow`, run by an operator or piped into a pager integration. A notification is
acknowledged once it was handed on, so one raised while no reader ran is delivered when one
starts; readers of one queue share its notifications.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from aio_pika.abc import AbstractIncomingMessage
from aiormq.exceptions import ChannelNotFoundEntity

from shared.bootstrap import open_broker
from shared.broker.connection import login_user
from shared.broker.envelope import user_of
from shared.broker.senders import Senders, agent_role
from shared.broker.topology import Names
from shared.config import Settings
from shared.domain.journal import Alert
from shared.domain.messages import AlertMessage, decode
from shared.domain.workflow import AGENTS
from shared.errors import ConfigurationError, ContractViolation
from shared.store.factory import open_store

ALERT_SENDERS = frozenset(
    {"submission", "scheduler", "supervisor", *(agent_role(a) for a in AGENTS)}
)
"""The processes that raise alerts (shared/broker/access.py lets them write `<hub>.alerts`)."""


async def recent_alerts(settings: Settings, since: datetime | None, limit: int) -> list[Alert]:
    """Stored alerts, newest first: those raised after `since` (None: any), `limit` at most."""
    store = await open_store(settings)
    try:
        return await store.list_alerts(since=since, limit=limit)
    finally:
        await store.close()


@dataclass(frozen=True)
class Feed:
    """Where a read notification goes: `alert` for each one taken, `refused` (with why) for a
    message that is not one of ours, which is dropped (the queue has no dead-letter queue)."""

    alert: Callable[[Alert], None]
    refused: Callable[[str], None]


async def follow_alerts(
    settings: Settings, feed: Feed, *, burst: bool, stop: asyncio.Event | None = None
) -> int:
    """Hand each notification of `<hub>.alerts.feed` to `feed`, oldest first, acknowledging it
    after; with `burst`, until the queue is empty, else until `stop` is set. How many alerts."""
    names = Names(settings.hub)
    senders = Senders.of(
        settings.hub, settings.broker_user_prefix, login_user(settings.rabbitmq_url), "operator"
    )
    connection = await open_broker(settings, name="orderflow-alerts")
    try:
        channel = await connection.channel()
        await channel.set_qos(prefetch_count=settings.prefetch)
        try:
            queue = await channel.declare_queue(names.alert_feed, passive=True)
        except ChannelNotFoundEntity:
            raise ConfigurationError(
                f"queue {names.alert_feed} does not exist: run `orderflow init`"
            ) from None
        taken = 0

        async def one(message: AbstractIncomingMessage) -> None:
            nonlocal taken
            alert = _read(message, senders, settings.max_message_bytes)
            if isinstance(alert, str):
                feed.refused(alert)
                await message.reject(requeue=False)
                return
            feed.alert(alert)
            await message.ack()
            taken += 1

        if burst:
            while (message := await queue.get(no_ack=False, fail=False)) is not None:
                await one(message)
            return taken
        tag = await queue.consume(one)
        try:
            await (stop or asyncio.Event()).wait()
        finally:
            with contextlib.suppress(Exception):
                await queue.cancel(tag)
        return taken
    finally:
        await connection.close()


def _read(message: AbstractIncomingMessage, senders: Senders, limit: int) -> Alert | str:
    """The alert a message carries, or why it is refused."""
    refused = senders.refusal(user_of(message), ALERT_SENDERS)
    if refused is not None:
        return f"a notification dropped: {refused}"
    try:
        contract = decode(message.type, message.body, max_bytes=limit)
    except ContractViolation as exc:
        return f"a notification dropped: {exc}"
    if not isinstance(contract, AlertMessage):
        return f"a notification dropped: a {contract.message_type} message, not an alert"
    return contract.alert
