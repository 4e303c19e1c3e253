"""Alerts for the operator: those stored (`orderflow alerts list`), and the notifications of
`<hub>.alerts.feed`, the bounded hand-off of alert notifications to their reader.

Every alert is stored (`orderflow alerts list` reads the store) and published on the fanout
exchange `<hub>.alerts`, whose queue `<hub>.alerts.feed` keeps the newest
`ORDERFLOW_ALERTS_QUEUE_MAX_LENGTH` of them until a reader takes them: `orderflow alerts
follow`, run by an operator or piped into a pager integration, or the notifier (`orderflow serve
notifier`, services/notifier), which delivers them to webhooks. A notification is
acknowledged once it was handed on, so one raised while no reader ran is delivered when one
starts; readers of one queue share its notifications (so run either the notifier or `follow`).

`orderflow alerts ack|resolve` record who acknowledged or resolved an alert, and when, beside it
in the store; the notifier tells the targets.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from shared.broker.dead_letters import describe, give_back, header_value
from shared.broker.envelope import TARGET, user_of
from shared.broker.port import Connection, Incoming
from shared.broker.senders import Senders, agent_role
from shared.broker.topology import Names, existing_queue
from shared.config import BrokerSettings
from shared.domain.journal import Alert
from shared.domain.messages import AlertMessage, decode
from shared.domain.timing import utcnow
from shared.domain.workflow import AGENTS
from shared.errors import ContractViolation

ALERT_SENDERS = frozenset(
    {"submission", "scheduler", "supervisor", *(agent_role(a) for a in AGENTS)}
)
"""The processes that raise alerts (shared/broker/access.py lets them write `<hub>.alerts`)."""


@dataclass(frozen=True)
class Feed:
    """Where a read notification goes: `alert` for each one taken, `refused` (with why) for a
    message that is not one of ours, which is dropped (the queue has no dead-letter queue)."""

    alert: Callable[[Alert], None]
    refused: Callable[[str], None]


async def follow_alerts(
    connection: Connection,
    names: Names,
    senders: Senders,
    broker: BrokerSettings,
    feed: Feed,
    *,
    burst: bool,
    stop: asyncio.Event | None = None,
) -> int:
    """Hand each notification of `<hub>.alerts.feed` to `feed`, oldest first, acknowledging it
    after; with `burst`, until the queue is empty, else until `stop` is set. How many alerts.
    `senders`: who may raise them, as the operator's user sees it."""
    await existing_queue(connection, names.alert_feed)
    channel = await connection.feed(prefetch=broker.prefetch)
    try:
        taken = 0

        async def one(message: Incoming) -> None:
            nonlocal taken
            alert = read_notification(message, senders, broker.max_message_bytes)
            if isinstance(alert, str):
                feed.refused(alert)
                await message.reject(requeue=False)
                return
            feed.alert(alert)
            await message.ack()
            taken += 1

        if burst:
            while (message := await channel.get(names.alert_feed)) is not None:
                await one(message)
            return taken
        tag = await channel.consume(names.alert_feed, one)
        try:
            await (stop or asyncio.Event()).wait()
        finally:
            with contextlib.suppress(Exception):
                await channel.cancel(tag)
        return taken
    finally:
        with contextlib.suppress(Exception):
            await channel.close()  # what it did not acknowledge goes back to the feed


async def alert_letters(connection: Connection, names: Names) -> list[dict[str, Any]]:
    """`undelivered_alerts` on a connection: fetched unacknowledged and given back uncounted
    where the broker can, as every dead-letter listing (shared/broker/dead_letters.py)."""
    await existing_queue(connection, names.alert_dead_letters)
    channel = await connection.feed(prefetch=0)
    now = utcnow()
    taken = []
    try:
        while (message := await channel.get(names.alert_dead_letters)) is not None:
            taken.append(message)
    finally:
        await give_back(taken)
        await channel.close()
    return [
        describe(names.alert_feed, m, now) | {"target": header_value((m.headers or {}).get(TARGET))}
        for m in taken
    ]


def read_notification(message: Incoming, senders: Senders, limit: int) -> Alert | str:
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
