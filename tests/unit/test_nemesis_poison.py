"""The nemesis's poison strike on a hub whose orders queue is full: what the full queue refuses
is dropped (a refusal is the queue's answer, not a fault the harness failed to apply), and the
rest is delivered. On the memory broker, which refuses as RabbitMQ does (`reject-publish`)."""

from __future__ import annotations

from typing import Any

from harness.nemesis.schedule import Fault, Kind
from harness.nemesis.strikes import Striker
from shared.broker.memory import MemoryBroker, connect
from shared.broker.port import Connection
from shared.broker.topology import Names, QueuePolicy, declare_topology
from shared.domain.workflow import AGENTS


async def test_poison_a_full_queue_refuses_is_dropped_and_the_rest_delivered() -> None:
    broker = MemoryBroker()
    names = Names("h")
    setup = connect(broker, "guest")
    admin = await setup.admin()
    policy = QueuePolicy(quorum=True, delivery_limit=5, orders_max_length=1)
    await declare_topology(admin, names, policy)
    nowhere: Any = None
    striker = Striker(
        seed=1, hub="h", fleet=nowhere, pg=nowhere, mq=nowhere, remote=nowhere, calm_hang_rate=0
    )

    async def memory_broker(timeout: float = 180) -> Connection:
        return connect(broker, "guest", name="nemesis")

    striker._broker = memory_broker  # type: ignore[method-assign]
    # Six poison messages: three for the orders queue (room for one), three for the agents.
    await striker.strike(Fault(0.0, Kind.POISON, 0.0, amount=6), begin=0.0)
    assert striker.unapplied == []
    assert await admin.depth(names.orders) == 1
    assert sum([await admin.depth(names.agent(a)) or 0 for a in AGENTS]) == 3
    await setup.close()
