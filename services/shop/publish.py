"""Publishing orders as a shop does: to `<hub>.submit` with publisher confirms, and, when asked,
following their status messages on a status queue of the application's until each is final.

The application declares no queue: it names a new status queue in its orders, submission
declares it for the first one, and the follower consumes it from then on
(shared/broker/private.py)."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from services.shop.orders import message_id_of
from shared.bootstrap import open_broker, open_publisher
from shared.broker.envelope import user_of
from shared.broker.port import Incoming
from shared.broker.private import STATUS_QUEUES_PER_APP, PrivateQueue
from shared.broker.publisher import Publishing
from shared.broker.senders import APP, STATUS_SENDERS, Senders
from shared.broker.topology import APP_NAME, Names
from shared.broker.urls import first_url, login_user
from shared.config import BrokerSettings, Settings
from shared.domain.messages import Contract, OrderStatus, OrderStatusUpdate, SubmitOrder
from shared.domain.models import OrderData
from shared.errors import ConfigurationError, PublishError, PublishRejected

FINAL = {
    OrderStatus.COMPLETED,
    OrderStatus.FAILED,
    OrderStatus.COMPENSATED,
    OrderStatus.CANCELLED,
}


def app_name(broker: BrokerSettings, app: str | None) -> str:
    """The submitting application's name, which prefixes its status queues: `--app`, or else
    the user name in ORDERFLOW_RABBITMQ_URL (the RabbitMQ user is the application)."""
    name = app or urlsplit(first_url(broker.rabbitmq_url)).username or ""
    if not APP_NAME.fullmatch(name):
        raise ConfigurationError(
            f"application name {name!r} (--app, or the user in ORDERFLOW_RABBITMQ_URL) must "
            f"match {APP_NAME.pattern}: it prefixes the application's status queues"
        )
    return name


class StatusFollower:
    """The status messages of the orders a shop submitted, taken from its status queue until
    each order is final; each told to `tell` as a line (unescaped)."""

    def __init__(
        self, hub: str, broker: BrokerSettings, order_ids: set[str], tell: Callable[[str], None]
    ) -> None:
        self.statuses: dict[str, OrderStatus] = {}
        self.pending = order_ids
        self._tell = tell
        self._finished = asyncio.Event()
        self._senders = Senders.of(
            hub, broker.broker_user_prefix, login_user(broker.rabbitmq_url), APP
        )

    def on_status(self, contract: Contract, message: Incoming) -> None:
        if not isinstance(contract, OrderStatusUpdate):
            return
        refused = self._senders.refusal(user_of(message), STATUS_SENDERS)
        if refused is not None:  # only our processes report an order's status
            self._tell(f"a status message dropped: {refused}")
            return
        # Statuses come from several processes, in no order between them: a Received sent again
        # for a copy of the order's message (decision:orders-deduped-by-order) may arrive after its
        # final status,
        # which it does not undo. A final status stands until another final one.
        if contract.status in FINAL or self.statuses.get(contract.order_id) not in FINAL:
            self.statuses[contract.order_id] = contract.status
        detail = f" ({contract.detail})" if contract.detail else ""
        self._tell(f"{contract.order_id}: {contract.status.value}{detail}")
        if all(self.statuses.get(o) in FINAL for o in self.pending):
            self._finished.set()

    async def wait(self, timeout: float) -> list[str]:
        """Until every pending order is final; those that were not within `timeout`."""
        if not self.pending:
            return []
        try:
            await asyncio.wait_for(self._finished.wait(), timeout=timeout)
        except TimeoutError:
            return sorted(o for o in self.pending if self.statuses.get(o) not in FINAL)
        return []

    def final(self) -> dict[str, int]:
        """The final statuses seen, counted."""
        return dict(Counter(s.value for s in self.statuses.values() if s in FINAL))


async def submit_orders(
    settings: Settings,
    orders: list[OrderData],
    *,
    wait: bool,
    timeout: float,
    concurrency: int,
    tell: Callable[[str], None],
    app: str | None = None,
) -> dict[str, Any]:
    """Publish the orders, `concurrency` awaiting their confirms at once; with `wait`, follow
    their status messages until each is final or `timeout` passes, telling `tell` each one
    (unescaped) as a line. What was published, refused, unconfirmed, not final in time, and
    the final statuses counted."""
    names = Names(settings.hub)
    status_queue = names.status_queue(app_name(settings.broker, app)) if wait else None
    connection = await open_broker(settings, name="orderflow-submit")
    follower = StatusFollower(settings.hub, settings.broker, {o.order_id for o in orders}, tell)
    replies = None
    try:
        if status_queue is not None:
            replies = PrivateQueue(
                connection,
                status_queue,
                follower.on_status,
                max_bytes=settings.broker.max_message_bytes,
            )
            await replies.start()
        publisher = await open_publisher(settings, connection)
        outcome = await _publish_all(publisher, names, orders, replies, concurrency)
        follower.pending -= {*outcome["rejected"], *outcome["failed"]}
        if wait:
            outcome["timed_out"] = await follower.wait(timeout)
            if outcome["timed_out"] and replies is not None and not replies.attached:
                tell(
                    f"no status queue {replies.name}: submission did not declare it (it "
                    f"declares at most {STATUS_QUEUES_PER_APP} of one application; see its log)"
                )
        outcome["final"] = follower.final()
        return outcome
    finally:
        if replies is not None:
            await replies.stop()
        await connection.close()


async def _publish_all(
    publisher: Publishing,
    names: Names,
    orders: list[OrderData],
    replies: PrivateQueue | None,
    concurrency: int,
) -> dict[str, Any]:
    outcome: dict[str, Any] = {"published": 0, "rejected": [], "failed": [], "timed_out": []}
    gate = asyncio.Semaphore(concurrency)

    async def one(order: OrderData) -> None:
        async with gate:
            try:
                await publisher.publish(
                    SubmitOrder(order=order, reply_to=replies.name if replies else None),
                    exchange=names.submit,
                    routing_key=names.orders,
                    message_id=message_id_of(order),
                    correlation_id=order.order_id,
                )
                outcome["published"] += 1
            except PublishRejected:
                outcome["rejected"].append(order.order_id)
            except PublishError:
                outcome["failed"].append(order.order_id)

    await asyncio.gather(*(one(o) for o in orders))
    return outcome
