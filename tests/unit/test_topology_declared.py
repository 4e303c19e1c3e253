"""The hub's topology as `declare_topology` leaves it on the broker model, and a consumer of a
queue that was never declared (shared/broker/topology.py, subscription.py)."""

from __future__ import annotations

import pytest

from harness.simulation import loop as virtual
from shared.broker.memory import MemoryBroker, connect
from shared.broker.port import QueueMissing
from shared.broker.subscription import Subscription
from shared.broker.topology import Names, QueuePolicy, declare_topology

POLICY = QueuePolicy(quorum=True, delivery_limit=3, orders_max_length=100)


def test_each_queue_is_bound_to_a_fanout_exchange_by_its_own_name_once() -> None:
    """As aio-pika bound them before the port: a fanout ignores the key, but a binding made
    again under another key is a second binding, so `init` on a hub an older release made must
    use the same one (review of issue 34)."""

    async def main() -> None:
        broker = MemoryBroker()
        admin = await connect(broker, "admin").admin()
        await declare_topology(admin, Names("h"), POLICY)
        before = {name: list(x.bindings) for name, x in broker.exchanges.items()}
        await declare_topology(admin, Names("h"), POLICY)  # `orderflow init` again
        assert {name: list(x.bindings) for name, x in broker.exchanges.items()} == before
        fanouts = [x for x in broker.exchanges.values() if x.kind == "fanout"]
        assert fanouts and all(x.bindings for x in fanouts)
        for exchange in fanouts:
            for queue, key in exchange.bindings:
                assert key == queue, (exchange.name, queue, key)

    virtual.run(main())


def test_a_consumer_of_a_queue_never_declared_says_the_queue_is_missing() -> None:
    """`QueueMissing`, which the CLI reads as a hub `orderflow init` never set up (exit 1), not
    a configuration error of the settings (exit 2)."""

    async def main() -> None:
        broker = MemoryBroker()
        names = Names("h")
        await declare_topology(await connect(broker, "admin").admin(), names, POLICY)
        del broker.queues[names.orders]
        consumer = Subscription(
            connection=connect(broker, "h-submission"), queue=names.orders, names=names, prefetch=1
        )
        with pytest.raises(QueueMissing):
            await consumer.start()

    virtual.run(main())
