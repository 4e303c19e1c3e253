"""Issue 33's attacks on intake (items 1 and 2), each as the broker user it comes from: an
application's user of the generated definitions in a scratch vhost (tests/support/vhost.py),
against the real processes, each under its own user, on PostgreSQL.

- A valid order sent with `x-delivery-count: 99` was dead-lettered at its first delivery as
  `redelivery-limit`, "delivered 100 times"; one with a forged `x-death` too must end
  Processed. A count or death record the broker did not write decides nothing.
- Admission control: an application's burst over the backlog threshold pauses submission; the
  broker's own count of consumers on `<hub>.orders` is 0 while it is paused, and never 2 (two
  pauses interleaved with a resume left a consumer live that nothing cancelled: shown with a
  fake queue, tests/unit/test_admission_schedules.py; here the real stack, its bursts).

One vhost and one topology serve the module's cases; the scheduler starts only once the
admission case has seen submission paused (it keeps the backlog over the threshold until then).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import signal
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aio_pika
import pytest
import pytest_asyncio

from shared.broker.consumer import REASON
from shared.broker.publisher import Publisher
from shared.broker.rabbitmq import RabbitConnection
from shared.broker.topology import Names
from shared.domain.messages import SubmitOrder
from shared.domain.states import ProcessState
from tests.support.factories import order_data
from tests.support.topology import Topology, running_topology
from tests.support.vhost import AMQP_HOST, Broker, scratch_vhost, take_dead_letters
from tests.support.waiting import eventually

pytestmark = [
    pytest.mark.rabbitmq,
    pytest.mark.postgres,
    pytest.mark.asyncio(loop_scope="module"),
]

THRESHOLD = 3
"""ORDERFLOW_BACKLOG_THRESHOLD: submission pauses over 3 outstanding orders, resumes at 2."""
PREFETCH = 4
BURST = 24
"""Orders of the burst: several pauses and resumes once the scheduler drains them."""


@dataclass
class World:
    broker: Broker
    topo: Topology
    app: RabbitConnection
    publisher: Publisher
    observer: aio_pika.abc.AbstractChannel
    """The operator's channel, asking the broker about `<hub>.orders` (a passive declare)."""

    @property
    def names(self) -> Names:
        return Names(self.broker.hub)

    @property
    def shop(self) -> str:
        return self.broker.apps[0]

    def serve(self, label: str, *args: str, role: str) -> None:
        proc = self.topo.procs.get(label)
        if proc is None or proc.poll() is not None:
            self.topo.serve(label, *args, ORDERFLOW_RABBITMQ_URL=self.broker.url(role))

    async def submit(self, order_id: str, headers: dict[str, Any] | None = None) -> None:
        """A valid order from the shop's user, with its `user_id` and these headers."""
        order = order_data(order_id)
        await self.publisher.publish(
            SubmitOrder(order=order),
            exchange=self.names.submit,
            routing_key=self.names.orders,
            message_id=f"order:{order_id}:{order.fingerprint()[:16]}",
            headers=headers,
        )

    async def orders_queue(self) -> tuple[int, int]:
        """(consumers, ready messages) of `<hub>.orders`, as the broker counts them."""
        underlay = await self.observer.get_underlay_channel()
        declared = await underlay.queue_declare(self.names.orders, passive=True)
        return int(declared.consumer_count or 0), int(declared.message_count or 0)

    async def state(self, order_id: str) -> ProcessState | None:
        state = await self.topo.store.get_state(f"{self.shop}/{order_id}")
        return None if state is None else state.process_state


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def world(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[World]:
    hub = f"t{uuid.uuid4().hex[:12]}"
    workdir: Path = tmp_path_factory.mktemp("intake")
    async with (
        scratch_vhost(hub) as broker,
        running_topology(
            hub,
            workdir,
            ORDERFLOW_RABBITMQ_URL=broker.url("admin"),
            ORDERFLOW_BACKLOG_THRESHOLD=str(THRESHOLD),
            ORDERFLOW_BACKLOG_CHECK_S="0.1",
            ORDERFLOW_PREFETCH=str(PREFETCH),
        ) as topo,
    ):
        topo.serve("remote", "remote", ORDERFLOW_RABBITMQ_URL=f"amqp://nobody@{AMQP_HOST}/none")
        app = await broker.port(broker.apps[0])
        operator = await broker.connect("operator")
        try:
            w = World(
                broker,
                topo,
                app,
                await Publisher.open(app, timeout=10),
                await operator.channel(),
            )
            w.serve("submission", "submission", role="submission")
            w.serve("supervisor-1", "supervisor", role="supervisor")
            for agent in ("inventory", "payment", "shipping"):
                w.serve(agent, "agent", agent, role=f"agent-{agent}")
            await topo.wait_remote()
            yield w
        finally:
            with contextlib.suppress(Exception):
                await app.close()
            with contextlib.suppress(Exception):
                await operator.close()


@dataclass
class Watch:
    """The broker's count of consumers on `<hub>.orders`, read again and again."""

    samples: list[tuple[int, int]] = field(default_factory=list)
    """(consumers, ready), in order."""

    async def run(self, world: World) -> None:
        while True:
            self.samples.append(await world.orders_queue())
            await asyncio.sleep(0.02)

    def transitions(self) -> int:
        seen = [c for c, _ in self.samples]
        return sum(1 for a, b in itertools.pairwise(seen) if a != b)


async def test_a_burst_over_the_threshold_pauses_intake_with_no_consumer_and_never_two(
    world: World,
) -> None:
    scheduler = world.topo.procs.get("scheduler-1")
    if scheduler is not None and scheduler.poll() is None:  # run alone after the other case
        world.topo.signal("scheduler-1", signal.SIGTERM)
        scheduler.wait(timeout=30)
    watch = Watch()
    watching = asyncio.create_task(watch.run(world))
    try:
        await eventually(
            lambda: _one_consumer(world), timeout=60, what="submission consuming <hub>.orders"
        )
        ids = [f"burst-{uuid.uuid4().hex[:8]}-{i}" for i in range(BURST)]
        for order_id in ids:
            await world.submit(order_id)

        # Paused: no consumer on the queue, the rest of the burst waiting in it, and so it
        # stays while the backlog is over the threshold (no scheduler takes any yet).
        async def paused() -> bool:
            consumers, ready = watch.samples[-1]
            return consumers == 0 and ready > 0

        await eventually(paused, timeout=30, what="submission paused with orders waiting")
        since = len(watch.samples)

        async def observed() -> bool:
            return len(watch.samples) >= since + 25

        await eventually(observed, timeout=30, what="the pause observed for 25 samples")
        assert all(c == 0 and r > 0 for c, r in watch.samples[since:]), watch.samples[since:]
        outstanding = await world.topo.store.count_in_states(
            frozenset({ProcessState.PENDING, ProcessState.PROCESSING})
        )
        assert outstanding > THRESHOLD

        # The scheduler drains the backlog: submission resumes and pauses as it goes, and
        # every order of the burst ends Processed.
        world.serve("scheduler-1", "scheduler", role="scheduler")

        async def all_processed() -> bool:
            states = [await world.state(o) for o in ids]
            return all(s is ProcessState.PROCESSED for s in states)

        await eventually(all_processed, timeout=180, interval=0.5, what="the burst Processed")
        await eventually(
            lambda: _one_consumer(world), timeout=30, what="submission consuming again"
        )
    finally:
        watching.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watching
    most = max(c for c, _ in watch.samples)
    print(
        f"consumer-count samples: {len(watch.samples)}, changes: {watch.transitions()}, "
        f"most at once: {most}"
    )
    assert most <= 1, "two consumers on <hub>.orders at once"
    assert watch.transitions() >= 3, "paused, resumed and paused again at least"


async def _one_consumer(world: World) -> bool:
    consumers, _ = await world.orders_queue()
    return consumers == 1


async def test_a_delivery_count_or_death_record_its_sender_wrote_decides_nothing(
    world: World,
) -> None:
    """Before: the order with `x-delivery-count: 99` was dead-lettered `redelivery-limit`
    ("delivered 100 times") at its first delivery. Now both orders end Processed and no dead
    letter names them."""
    world.serve("scheduler-1", "scheduler", role="scheduler")
    counted = f"counted-{uuid.uuid4().hex[:8]}"
    died = f"died-{uuid.uuid4().hex[:8]}"
    await world.submit(counted, {"x-delivery-count": 99})
    await world.submit(
        died,
        {
            "x-death": [
                {
                    "reason": "delivery_limit",
                    "queue": world.names.orders,
                    "count": 99,
                    "exchange": world.names.submit,
                }
            ],
            "x-first-death-reason": "delivery_limit",
            "x-first-death-queue": world.names.orders,
        },
    )

    operator = await world.broker.connect("operator")
    dead: list[Any] = []

    async def settled() -> bool:
        dead.extend(await take_dead_letters(operator, world.names.orders))
        states = [await world.state(o) for o in (counted, died)]
        return bool(dead) or all(s is ProcessState.PROCESSED for s in states)

    try:
        await eventually(settled, timeout=90, interval=0.3, what="both orders settled")
    finally:
        await operator.close()
    assert not [(m.message_id, (m.headers or {}).get(REASON)) for m in dead]
    assert [await world.state(o) for o in (counted, died)] == [ProcessState.PROCESSED] * 2
