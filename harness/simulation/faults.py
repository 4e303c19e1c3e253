"""Striking the nemesis's catalogue of faults (harness/nemesis/schedule.py) in a simulation, and
the simulated wire that delays, reorders and duplicates messages.

Each fault strikes at its time and is lifted after its duration. Faults of one kind on one
target may overlap: the target stays struck until the last of them is lifted (a process killed
twice comes back once, when the later kill's time is up).
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from collections.abc import Callable

from harness.nemesis.schedule import POISON_BODIES, Fault, Kind
from harness.remote.app import Faults
from harness.remote.local import LocalRemote
from harness.simulation.shop import Shop
from harness.simulation.world import World
from shared.broker.memory import MemoryConnection
from shared.broker.port import Outgoing
from shared.broker.topology import Names
from shared.domain.workflow import AGENTS

KILL_ROUNDS = 100
"""A kill strikes after up to this many rounds of the loop past its time."""
Lift = Callable[[], None]
"""Ends a fault."""
Switch = Callable[[bool], None]
"""Strikes (True) or lifts (False) a fault."""


class Wire:
    """The broker's network (shared/broker/memory: `Network`): a share of messages is late by
    up to `max_delay_s` (so messages sent close together may arrive in another order), a share
    arrives twice, and the replies of an agent struck by LATE_REPLIES arrive after their step's
    deadline."""

    def __init__(
        self, rng: random.Random, *, delay_rate: float, max_delay_s: float, duplicate_rate: float
    ) -> None:
        self._rng = rng
        self.delay_rate = delay_rate
        self.max_delay_s = max_delay_s
        self.duplicate_rate = duplicate_rate
        self.late: dict[str, float] = {}
        """Broker users whose messages are held back this long."""
        self.doubled: dict[str, float] = {}
        """Broker users a share of whose messages arrive twice (a publisher sending again)."""

    def delay(self, queue: str, sender: str) -> float:
        held = self.late.get(sender)
        if held is not None:
            return held
        if self.delay_rate and self._rng.random() < self.delay_rate:
            return self._rng.uniform(0.0, self.max_delay_s)
        return 0.0

    def duplicate(self, queue: str, sender: str) -> bool:
        rate = self.doubled.get(sender, self.duplicate_rate)
        return bool(rate) and self._rng.random() < rate


class Striker:
    def __init__(
        self,
        world: World,
        shop: Shop,
        remote: LocalRemote,
        wire: Wire,
        *,
        calm: Faults,
        seed: int,
        rng: random.Random,
    ) -> None:
        self._world = world
        self._shop = shop
        self._remote = remote
        self._wire = wire
        self._calm = calm
        """The remote service's knobs when no fault strikes it."""
        self._seed = seed
        self._rng = rng
        self._struck: Counter[str] = Counter()
        self.active = 0
        """Faults struck and not yet lifted."""

    async def strike(self, fault: Fault) -> None:
        """Strike `fault` now, and lift it after its duration."""
        self.active += 1
        try:
            lift = await self._apply(fault)
            await asyncio.sleep(fault.duration_s)
            lift()
        finally:
            self.active -= 1

    def _hold(self, what: str, on: bool) -> bool:
        """Count a fault on `what` struck (`on`) or lifted; whether it changes anything (the
        first one struck, the last one lifted)."""
        self._struck[what] += 1 if on else -1
        return self._struck[what] == (1 if on else 0)

    async def _apply(self, fault: Fault) -> Lift:
        kind = fault.kind
        if kind is Kind.KILL:
            # Not only where time stands still for every task: at any point of the work the
            # loop does at this moment (each round moves every ready task one await further).
            for _ in range(self._rng.randrange(KILL_ROUNDS)):
                await asyncio.sleep(0)
            return self._kill(fault.target or "")
        if kind is Kind.BROKER_RESTART:
            return self._toggle("broker", self._world.broker.outage)
        if kind is Kind.STORE_RESTART:
            return self._toggle("store", self._store_down)
        if kind is Kind.REMOTE_OUTAGE:
            return self._toggle("remote-outage", self._remote_outage)
        if kind is Kind.REMOTE_HANGS:
            self._remote.service.faults.hang_rate = fault.amount
            return lambda: setattr(self._remote.service.faults, "hang_rate", self._calm.hang_rate)
        if kind is Kind.DUPLICATES:
            return await self._duplicates(fault)
        if kind is Kind.LATE_REPLIES:
            user = self._world.user_of(f"agent-{(fault.target or '').removesuffix('-1')}")
            late = self._world.settings.workflow.step_timeout_s + 1.0  # past the deadline
            self._wire.late[user] = late
            return lambda: _forget(self._wire.late, user)
        if kind is Kind.POISON:
            await self._poison(int(fault.amount))
            return _nothing
        assert kind is Kind.CLOCK_JUMP
        clock = self._world.processes[fault.target or ""].clock
        clock.offset += fault.amount
        return lambda: setattr(clock, "offset", clock.offset - fault.amount)

    def _toggle(self, what: str, switch: Switch) -> Lift:
        if self._hold(what, True):
            switch(True)

        def lift() -> None:
            if self._hold(what, False):
                switch(False)

        return lift

    def _kill(self, target: str) -> Lift:
        if target == "remote":
            return self._toggle("remote", self._remote_crash)
        process = self._world.processes[target]

        def switch(dead: bool) -> None:
            if dead:
                process.crash()
            else:
                process.start()

        return self._toggle(target, switch)

    def _store_down(self, down: bool) -> None:
        self._world.store_down = down

    def _remote_outage(self, down: bool) -> None:
        self._remote.service.faults.outage = down

    def _remote_crash(self, down: bool) -> None:
        if down:
            self._remote.crash()
        else:
            self._remote.restart()

    async def _duplicates(self, fault: Fault) -> Lift:
        """Orders already placed, published again (same message ids); and a scheduler that
        publishes every other message twice."""
        accepted = [p for p in self._shop.orders.values() if p.accepted]
        for placed in accepted[: int(fault.amount)]:
            self._shop.run(self._shop.place(placed))
        user = self._world.user_of(self._world.processes[fault.target or ""].kind)
        self._wire.doubled[user] = 0.5
        return lambda: _forget(self._wire.doubled, user)

    async def _poison(self, count: int) -> None:
        names = Names(self._world.settings.hub)
        connection = MemoryConnection(self._world.broker, "intruder", name="poison")
        try:
            sender = await connection.sender(timeout=5)
            for i in range(count):
                message = Outgoing(
                    POISON_BODIES[i % len(POISON_BODIES)],
                    message_id=f"poison-{self._seed}-{i}",
                    type="order.submit",
                    user_id="intruder",
                )
                exchange = names.exchange if i % 2 else names.submit
                key = names.agent(AGENTS[i % len(AGENTS)]) if i % 2 else names.orders
                await sender.publish(message, exchange=exchange, routing_key=key)
        except Exception:  # the broker may be out: poison that did not arrive is no poison
            pass
        finally:
            await connection.close()


def _forget(held: dict[str, float], user: str) -> None:
    held.pop(user, None)


def _nothing() -> None:
    """A fault with nothing to lift."""
