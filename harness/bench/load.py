"""A benchmark's load: generated orders published as a shop does, at a steady rate or as fast as
admission control takes them, and the wait until every one has settled."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from services.shop.orders import generated_order, message_id_of
from shared.bootstrap import open_broker
from shared.broker.publisher import Publisher
from shared.broker.topology import Names
from shared.config import Settings
from shared.domain.messages import SubmitOrder
from shared.domain.models import OrderData
from shared.domain.states import SETTLED_STATES
from shared.domain.timing import utcnow
from shared.errors import PublishError, PublishRejected
from shared.store.port import StateStore

SETTLED_POLL_S = 0.5
"""How often the bench counts the orders that settled."""

Progress = Callable[[str, int, int], None]
"""Told (what is counted, how many so far, how many in all) as a wait goes on."""


@dataclass
class Run:
    """One benchmark run: where it runs, what it offers, and when each order was published."""

    settings: Settings
    orders: int
    rate: float
    config: dict[str, Any]
    """The run's settings as the report shows them."""
    publish_at: dict[str, datetime] = field(default_factory=dict)
    started: float = 0.0
    finished: float = 0.0


async def publish(settings: Settings, run: Run, *, seed: int, concurrency: int = 200) -> None:
    """Publish `run.orders` generated orders at `run.rate` per second (0: as fast as the
    broker and admission control take them; a refused publish is retried after a pause)."""
    rng = random.Random(seed)
    orders = [generated_order(rng) for _ in range(run.orders)]
    names = Names(settings.hub)
    connection = await open_broker(settings, name="orderflow-bench")
    gate = asyncio.Semaphore(concurrency)
    loop = asyncio.get_running_loop()
    start = loop.time()
    try:
        publisher = await Publisher.open(connection, timeout=settings.broker.publish_timeout_s)

        async def one(i: int) -> None:
            if run.rate:
                delay = start + i / run.rate - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
            async with gate:
                await _publish_until_taken(publisher, names, run, orders[i])

        await asyncio.gather(*(one(i) for i in range(run.orders)))
        await publisher.close()
    finally:
        await connection.close()


async def _publish_until_taken(
    publisher: Publisher, names: Names, run: Run, order: OrderData
) -> None:
    while True:
        run.publish_at[order.order_id] = utcnow()
        try:
            await publisher.publish(
                SubmitOrder(order=order),
                exchange=names.submit,
                routing_key=names.orders,
                message_id=message_id_of(order),
                correlation_id=order.order_id,
            )
            return
        except PublishRejected:
            await asyncio.sleep(0.2)  # the orders queue is full: admission control
        except PublishError:
            # No confirm in time (a loaded broker) or a lost connection: the same message id
            # again, which finds its order recorded if the first copy arrived.
            await asyncio.sleep(1.0)


async def wait_settled(
    store: StateStore,
    run: Run,
    timeout: float,
    progress: Progress | None = None,
    publishing: asyncio.Task[None] | None = None,
) -> int:
    """Until every order is terminal; the number that are. A publisher that failed ends the
    wait with its error (its orders would never come)."""
    give_up = time.monotonic() + timeout
    while True:
        counts = await store.count_by_state()
        done = sum(counts[s] for s in SETTLED_STATES)
        if progress is not None:
            progress("orders terminal", done, run.orders)
        if done >= run.orders or time.monotonic() > give_up:
            return done
        raise_if_failed(publishing)
        # Each look counts the hub's whole state table: every 0.1 s it was a tenth of the
        # database's CPU in a long run. The figures come from the records, not from this.
        await asyncio.sleep(SETTLED_POLL_S)


def raise_if_failed(task: asyncio.Task[None] | None) -> None:
    if task is not None and task.done() and task.exception() is not None:
        task.result()
