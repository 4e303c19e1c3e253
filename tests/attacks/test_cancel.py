"""Cancellations through the HTTP API tell the order's application (issue 33, item 13): an order
cancelled while Pending sends its `Cancelled` status to the status queue the order named, whoever
cancels it, as `orderflow orders cancel` always did. Otherwise an application following the order
waits forever. As the API's callers: a shop token (`POST /orders/{id}/cancel`) and an operator
token (`POST /ops/order/cancel`).

The real API and submission, no scheduler (nothing claims: the orders stay Pending). The orders
are the API's own (placed by a shop), so their status queue is the API's; a queue of the test's
own, bound to the status exchange for every status queue of the hub, sees what the API's does.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import aio_pika
import pytest
import pytest_asyncio

from shared.broker.rabbitmq.connection import connect
from shared.broker.topology import Names
from shared.domain.messages import OrderStatus, OrderStatusUpdate
from shared.domain.states import ProcessState
from tests.conftest import RABBITMQ_URL
from tests.support.api import ApiClient, start_api, token
from tests.support.factories import order_data
from tests.support.topology import Topology, running_topology
from tests.support.waiting import eventually

pytestmark = [
    pytest.mark.rabbitmq,
    pytest.mark.postgres,
    pytest.mark.asyncio(loop_scope="module"),
]


class StatusTap:
    """Every status message the hub sends to any status queue, as its application gets it."""

    def __init__(self) -> None:
        self.seen: list[OrderStatusUpdate] = []

    async def start(self, hub: str) -> None:
        self.connection = await connect(RABBITMQ_URL, timeout=5, name="status-tap")
        channel = await self.connection.channel()
        queue = await channel.declare_queue(exclusive=True, auto_delete=True)
        status = await channel.get_exchange(Names(hub).status, ensure=False)
        await queue.bind(status, routing_key=f"{hub}.status.#")
        await queue.consume(self._take, no_ack=True)

    async def _take(self, message: aio_pika.abc.AbstractIncomingMessage) -> None:
        self.seen.append(OrderStatusUpdate.model_validate_json(message.body))

    async def stop(self) -> None:
        await self.connection.close()

    async def told(self, app_order_id: str, status: OrderStatus) -> OrderStatusUpdate:
        async def arrived() -> OrderStatusUpdate | None:
            found = [u for u in self.seen if (u.order_id, u.status) == (app_order_id, status)]
            return found[0] if found else None

        return await eventually(arrived, timeout=10, what=f"{status} of {app_order_id} told")


@dataclass
class Rig:
    topo: Topology
    api: ApiClient
    tap: StatusTap
    shop: str
    """A token of the shop `acme`."""
    operator: str
    """A token of the operator `otto`."""


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def rig(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Rig]:
    hub = f"t{uuid.uuid4().hex[:12]}"
    workdir: Path = tmp_path_factory.mktemp("cancel-attacks")
    async with running_topology(hub, workdir) as topo:
        topo.serve("submission", "submission")  # no scheduler: orders stay Pending
        tap = StatusTap()
        await tap.start(hub)
        api = await start_api(topo)
        try:
            yield Rig(topo, api, tap, token(topo, "shop", "acme"), token(topo, "operator", "otto"))
        finally:
            await api.close()
            await tap.stop()


async def place_pending(topo: Topology, api: ApiClient, shop: str, order_id: str) -> str:
    """Place an order as `shop`; its id in the store once it is Pending."""
    placed = await api.call("POST", "/orders", shop, order_data(order_id).model_dump(mode="json"))
    assert placed.status in (201, 202), placed
    stored = f"acme.{order_id}"

    async def pending() -> bool:
        record = await topo.store.get_state(stored)
        return record is not None and record.process_state is ProcessState.PENDING

    await eventually(pending, timeout=30, what=f"{stored} Pending")
    return stored


async def test_a_shops_cancel_tells_the_application(rig: Rig) -> None:
    stored = await place_pending(rig.topo, rig.api, rig.shop, "o-shop-cancel")
    cancelled = await rig.api.call("POST", "/orders/o-shop-cancel/cancel", rig.shop)
    assert cancelled.status == 200 and cancelled.body["outcome"] == "Cancelled", cancelled
    told = await rig.tap.told(stored, OrderStatus.CANCELLED)
    assert told.process_state is ProcessState.CANCELLED


async def test_an_operators_cancel_tells_the_application(rig: Rig) -> None:
    stored = await place_pending(rig.topo, rig.api, rig.shop, "o-ops-cancel")
    answer = await rig.api.call("POST", "/ops/order/cancel", rig.operator, order_id=stored)
    assert answer.status == 200, answer
    told = await rig.tap.told(stored, OrderStatus.CANCELLED)
    assert told.process_state is ProcessState.CANCELLED
