"""The shop of a simulation: an application that places orders and follows their statuses.

It publishes as its own broker user (`shop`) through `<hub>.submit`, as `orderflow submit`
does, and keeps publishing an order (the same message id) until the broker confirms it: an order
counts as accepted from its confirm on, and from then on it must never be lost. It may also
publish an order again (a client unsure its confirm arrived), or publish other data under an
order id already used (which must be refused, the first order kept).
"""

from __future__ import annotations

import asyncio
import contextvars
import random
from dataclasses import dataclass, field
from typing import Any

from services.shop.orders import generated_order, message_id_of
from shared.backoff import Backoff
from shared.broker.memory import MemoryBroker, connect
from shared.broker.port import Incoming
from shared.broker.private import PrivateQueue
from shared.broker.publisher import Publisher
from shared.broker.topology import Names
from shared.domain.messages import Contract, OrderStatus, OrderStatusUpdate, SubmitOrder
from shared.domain.models import OrderData, OrderLine, scoped
from shared.errors import PublishError

APP = "shop"
GIVE_UP_S = 900.0
"""Seconds the shop keeps publishing an order the broker does not take."""


@dataclass
class Placed:
    """What the shop knows of one order."""

    data: OrderData
    accepted: bool = False
    """The broker confirmed it (so the system must not lose it)."""
    statuses: list[OrderStatus] = field(default_factory=list)
    cancelled: bool = False
    """Its customer's cancellation was accepted (so it must never be Processed)."""

    @property
    def order_id(self) -> str:
        """The order's id in the system (the application's name before its own)."""
        return scoped(APP, self.data.order_id)

    @property
    def fingerprint(self) -> str:
        """The fingerprint of the order as the system records it (under its id there)."""
        return self.data.model_copy(update={"order_id": self.order_id}).fingerprint()


class Shop:
    def __init__(self, broker: MemoryBroker, names: Names, rng: random.Random) -> None:
        self._broker = broker
        self._names = names
        self._rng = rng
        self.orders: dict[str, Placed] = {}
        self.conflicts: list[str] = []
        """Message ids of the submissions that reuse an order id with other data."""
        self._publisher: Publisher | None = None
        self._statuses: PrivateQueue | None = None
        self._context = contextvars.copy_context()

    async def open(self) -> None:
        connection = connect(self._broker, APP, name="shop")
        self._statuses = PrivateQueue(
            connection, self._names.status_queue(APP), self._on_status, max_bytes=64 * 1024
        )
        await self._statuses.start()
        self._publisher = await Publisher.open(connection, timeout=10)

    def order(self, number: int, seed: int) -> Placed:
        data = generated_order(self._rng, order_id=f"o{number:03d}-s{seed}")
        placed = Placed(data)
        self.orders[placed.order_id] = placed
        return placed

    async def place(self, placed: Placed) -> None:
        """Publish until the broker takes it (the same message id every time)."""
        placed.accepted = await self._publish(placed.data, message_id_of(placed.data))

    async def conflict(self, placed: Placed) -> None:
        """Other data under an order id already placed: to be refused, the first kept."""
        line = OrderLine(sku="sku-conflict", quantity=1, unit_price_cents=1)
        other = placed.data.model_copy(update={"lines": [*placed.data.lines, line]})
        message_id = message_id_of(other)
        self.conflicts.append(message_id)
        await self._publish(other, message_id)

    async def _publish(self, data: OrderData, message_id: str) -> bool:
        """Whether the broker took it within `GIVE_UP_S` (a shop gives up at last)."""
        assert self._publisher is not None and self._statuses is not None
        pauses = Backoff(first=0.5, cap=10.0)
        give_up = asyncio.get_running_loop().time() + GIVE_UP_S
        while asyncio.get_running_loop().time() < give_up:
            try:
                await self._publisher.publish(
                    SubmitOrder(order=data, reply_to=self._statuses.name),
                    exchange=self._names.submit,
                    routing_key=self._names.orders,
                    message_id=message_id,
                    correlation_id=data.order_id,
                )
                return True
            except PublishError:
                await asyncio.sleep(pauses.next())
        return False

    def _on_status(self, contract: Contract, message: Incoming) -> Any:
        if isinstance(contract, OrderStatusUpdate):  # statuses carry the shop's own ids
            placed = self.orders.get(scoped(APP, contract.order_id))
            if placed is not None:
                placed.statuses.append(contract.status)

    def run(self, coroutine: Any) -> asyncio.Task[Any]:
        """A task of the shop's (outside every process of the topology)."""
        return asyncio.get_running_loop().create_task(coroutine, context=self._context.copy())
