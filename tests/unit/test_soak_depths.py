"""The soak fails on a queue whose depth it cannot read (harness/bench/soak.py `Soak.sample`,
from `queue_depths`' None): counted as empty, the queue would hide the growth the soak is there
to see. The error names the queue; the bench reports it as its failure, with the topology's last
words (harness/bench/run.py `_started`: `BenchFailed`, one line and exit 1 from the command).

On the memory broker and store, opened where the soak opens the real ones."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from harness.bench import soak
from harness.bench.soak import Soak
from shared.broker.memory import MemoryBroker, connect
from shared.broker.topology import Names
from shared.config import Settings
from shared.store.memory import MemoryStore


@pytest.fixture
def broker(monkeypatch: pytest.MonkeyPatch) -> Iterator[MemoryBroker]:
    made = MemoryBroker()

    async def open_broker(settings: Settings, *, name: str) -> object:
        return connect(made, "guest", name=name)

    monkeypatch.setattr(soak, "open_broker", open_broker)
    yield made


def declare(broker: MemoryBroker, queues: list[str]) -> None:
    for queue in queues:
        broker.declare_queue(queue, owner=None, durable=True)


async def test_a_queue_it_cannot_read_fails_the_soak_naming_the_queue(
    broker: MemoryBroker, hub: str
) -> None:
    unread, *readable = Names(hub).durable_queues()
    declare(broker, readable)
    soaking = Soak(Settings(hub=hub), MemoryStore())
    with pytest.raises(RuntimeError, match=f"could not read the depth of {unread}$"):
        await soaking.wait(orders=0, timeout=5)
    assert soaking.sizes.samples == 0, "a sample was taken without the queue"
    assert broker.connections() == []


async def test_with_every_queue_read_the_soak_samples_them_all(
    broker: MemoryBroker, hub: str
) -> None:
    queues = Names(hub).durable_queues()
    declare(broker, queues)
    soaking = Soak(Settings(hub=hub), MemoryStore())
    assert await soaking.wait(orders=0, timeout=5) == 0
    assert soaking.sizes.queues == dict.fromkeys(queues, 0)
