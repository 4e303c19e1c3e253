"""A hub on the reference adapters in memory, for tests that drive real processes in burst mode
under virtual time: no server, milliseconds a scenario.

Each process is the real one (`serve_submission`, `serve_scheduler`, ...) run with `burst=True`
until it has nothing left to do; agents, which a scheduler's attempts wait on, run beside it in
the background. Everything else is the simulation's world (harness/simulation/world.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import AsyncIterator, Coroutine
from typing import Any

from harness.remote.accounts import hub_account
from harness.remote.app import Faults, RemoteService
from harness.remote.ledger import Ledger
from harness.remote.local import LocalRemote
from harness.simulation.run import HUB, initialise, settings_for
from harness.simulation.shop import Placed, Shop
from harness.simulation.world import ProcessClock, StoreHandle, StoreLink, World
from services.agents.agent import serve_agent
from services.scheduler.service import serve_scheduler
from services.submission.service import serve_submission
from services.supervisor.service import serve_supervisor
from shared import clock
from shared.bootstrap import Runtime
from shared.broker.memory import MemoryBroker, connect
from shared.broker.topology import Names
from shared.domain.models import StateRecord
from shared.domain.workflow import AGENTS

Scenario = Coroutine[Any, Any, None]


class MemoryHub:
    def __init__(self, world: World, shop: Shop) -> None:
        self.world = world
        self.store = world.store
        self.shop = shop
        self.names = Names(HUB)
        self._numbers = iter(range(1, 10**6))

    @property
    def settings(self) -> Any:
        return self.world.settings

    @property
    def faults(self) -> Faults:
        return self.world.remote.service.faults

    async def runtime(
        self, kind: str, name: str | None = None, *, down: bool = False, **settings: Any
    ) -> Runtime:
        """A runtime of a process of `kind`, with `settings` changed from the hub's; `down`:
        its store fails every call while `world.store_down` is set (an outage)."""
        connection = connect(self.world.broker, self.world.user_of(kind), name=name or kind)
        own = self.world.settings_of(kind).replace(**settings)
        store: Any = StoreHandle(self.world.store, self.world) if down else self.world.store
        return await Runtime.on(own, name or kind, store, connection)

    async def place(self) -> Placed:
        placed = self.shop.order(next(self._numbers), 0)
        await self.shop.place(placed)
        return placed

    async def submission(self) -> None:
        await serve_submission(await self.runtime("submission"), asyncio.Event(), burst=True)

    async def scheduler(self, name: str = "scheduler-1") -> None:
        """A scheduler's burst, with the agents its attempts ask running beside it."""
        async with self.agents():
            runtime = await self.runtime("scheduler", name)
            await serve_scheduler(runtime, asyncio.Event(), burst=True)

    async def supervisor(self, name: str = "supervisor-1", **settings: Any) -> None:
        runtime = await self.runtime("supervisor", name, **settings)
        await serve_supervisor(runtime, asyncio.Event(), burst=True)

    @contextlib.asynccontextmanager
    async def agents(self) -> AsyncIterator[None]:
        stop = asyncio.Event()
        running = [
            asyncio.create_task(
                serve_agent(a, await self.runtime(f"agent-{a}"), stop, client=self.world.remote)
            )
            for a in AGENTS
        ]
        try:
            yield
        finally:
            stop.set()
            await asyncio.gather(*running)

    async def state(self, placed: Placed) -> StateRecord:
        state = await self.store.get_state(placed.order_id)
        assert state is not None, f"{placed.order_id} is not recorded"
        return state

    async def effects(self, placed: Placed) -> list[tuple[str, str]]:
        """(operation, outcome) of the order's effects, in ledger order."""
        return [
            (e["operation"], e["outcome"])
            for e in await self.world.remote.ledger(order_id=placed.order_id, account=HUB)
        ]

    async def sleep(self, seconds: float) -> None:
        """Let virtual time pass (every process's clock with it)."""
        await asyncio.sleep(seconds)


def run(scenario: Any, **faults: Any) -> None:
    """Run `scenario(hub)` on a fresh hub under virtual time; `faults`: the remote service's
    knobs (transient_error_rate, decline_rate, ...)."""

    async def main() -> None:
        loop = asyncio.get_running_loop()
        clock.CLOCK.set(ProcessClock(loop))
        random.seed(0)
        settings = settings_for(0)
        service = RemoteService(
            Ledger(":memory:"),
            Faults(**faults),
            random.Random(0),
            admin_token=None,
            accounts=hub_account(settings),
        )
        remote = LocalRemote(service, account=HUB)
        link = StoreLink(random.Random(0), slow_rate=0.0, max_latency_s=0.0)
        world = World(settings, remote, MemoryBroker(), link)
        await initialise(world)
        shop = Shop(world.broker, Names(HUB), random.Random(0))
        await shop.open()
        try:
            await scenario(MemoryHub(world, shop))
        finally:
            service.ledger.close()

    from harness.simulation import loop as virtual

    virtual.run(main(), wall_s=30)
