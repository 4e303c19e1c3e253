"""Striking a nemesis run's faults at its topology: each fault of the schedule at its time, on
its target, for its duration, then lifted (harness/nemesis/schedule.py describes each kind).

Faults on one target (a process, a server, the remote service's knobs) take turns: a fault waits
for the one before it on the same target to be lifted. A fault the harness could not strike is
noted as unapplied, and the run fails: it proved less than it says.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from harness.nemesis.fleet import Fleet
from harness.nemesis.schedule import POISON_BODIES, Fault, Kind
from harness.nemesis.servers import PrivatePostgres, PrivateRabbitMQ
from shared.broker.port import Connection, Outgoing
from shared.broker.rabbitmq import connect
from shared.broker.topology import Names
from shared.domain.workflow import AGENTS
from shared.errors import PublishRejected
from shared.remote.client import RemoteClient

LIBFAKETIME = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1")
STOP_APP_TIMEOUT_S = 120.0


class Striker:
    def __init__(
        self,
        *,
        seed: int,
        hub: str,
        fleet: Fleet,
        pg: PrivatePostgres,
        mq: PrivateRabbitMQ,
        remote: RemoteClient,
        calm_hang_rate: float,
    ) -> None:
        self.seed = seed
        self.hub = hub
        self.fleet = fleet
        self.pg = pg
        self.mq = mq
        self.remote = remote
        self.calm_hang_rate = calm_hang_rate
        """The share of remote calls that hang outside a `remote-hangs` fault."""
        self.unapplied: list[str] = []
        """Faults of the schedule that could not be struck, and why."""
        self._locks: dict[str, asyncio.Lock] = {}
        self._strikes: dict[Kind, Callable[[Fault], Awaitable[None]]] = {
            Kind.KILL: self._kill,
            Kind.BROKER_RESTART: self._broker_restart,
            Kind.STORE_RESTART: self._store_restart,
            Kind.REMOTE_OUTAGE: self._remote_outage,
            Kind.REMOTE_HANGS: self._remote_hangs,
            Kind.DUPLICATES: self._duplicates,
            Kind.LATE_REPLIES: self._late_replies,
            Kind.POISON: self._poison,
            Kind.CLOCK_JUMP: self._clock_jump,
        }

    def _lock(self, name: str) -> asyncio.Lock:
        return self._locks.setdefault(name, asyncio.Lock())

    async def strike(self, fault: Fault, begin: float) -> None:
        """Strike `fault` at its time after `begin` (`time.monotonic()`), and lift it."""
        await until(begin + fault.at_s)
        try:
            await self._strikes[fault.kind](fault)
        except Exception as exc:
            # A fault the harness could not apply fails the run: it proved less than it says.
            self.unapplied.append(f"{fault.describe()}: could not apply: {exc}")

    async def _kill(self, fault: Fault) -> None:
        assert fault.target is not None
        async with self._lock(fault.target):
            await asyncio.to_thread(self.fleet.kill, fault.target)
            await asyncio.sleep(fault.duration_s)
            self.fleet.start(fault.target, self.fleet.args[fault.target])

    async def _broker_restart(self, fault: Fault) -> None:
        async with self._lock("rabbitmq"):
            # rabbitmqctl starts a VM of its own: on a loaded machine that takes a while.
            await asyncio.to_thread(self.mq.ctl, "stop_app", timeout=STOP_APP_TIMEOUT_S)
            await asyncio.sleep(fault.duration_s)
            await asyncio.to_thread(self.mq.start_app)

    async def _store_restart(self, fault: Fault) -> None:
        async with self._lock("postgres"):
            await asyncio.to_thread(self.pg.stop)
            await asyncio.sleep(fault.duration_s)
            await asyncio.to_thread(self.pg.start)

    async def _remote_outage(self, fault: Fault) -> None:
        async with self._lock("remote"):
            await self.set_faults(outage=True)
            await asyncio.sleep(fault.duration_s)
            await self.set_faults(outage=False)

    async def _remote_hangs(self, fault: Fault) -> None:
        async with self._lock("remote"):
            await self.set_faults(hang_rate=fault.amount)
            await asyncio.sleep(fault.duration_s)
            await self.set_faults(hang_rate=self.calm_hang_rate)

    async def _duplicates(self, fault: Fault) -> None:
        assert fault.target is not None
        await self._republish(int(fault.amount))
        # Its publisher sends half of what it publishes twice (shared/broker/drills.py).
        await self._restarted_with(
            fault,
            {"ORDERFLOW_FAULT_DUPLICATE_RATE": "0.5", "ORDERFLOW_FAULT_SEED": str(self.seed)},
        )

    async def _late_replies(self, fault: Fault) -> None:
        # Half its replies held back past their step's deadline (shared/broker/drills.py).
        await self._restarted_with(
            fault,
            {
                "ORDERFLOW_FAULT_REPLY_DELAY_RATE": "0.5",
                "ORDERFLOW_FAULT_REPLY_DELAY_MS": "3000",
                "ORDERFLOW_FAULT_SEED": str(self.seed),
            },
        )

    async def _clock_jump(self, fault: Fault) -> None:
        await self._restarted_with(fault, shifted(fault.amount))

    async def _restarted_with(self, fault: Fault, env: dict[str, str]) -> None:
        """The target restarted with `env` added for the duration, then with its own again."""
        assert fault.target is not None
        async with self._lock(fault.target):
            await asyncio.to_thread(self.fleet.restart, fault.target, env)
            await asyncio.sleep(fault.duration_s)
            await asyncio.to_thread(self.fleet.restart, fault.target)

    async def set_faults(self, **changes: Any) -> None:
        """Set the remote service's fault knobs; while it is down (killed by another fault) it
        is asked again until it answers."""
        deadline = time.monotonic() + 60
        while True:
            try:
                await self.remote.set_faults(**changes)
                return
            except Exception:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.2)

    async def _republish(self, count: int) -> None:
        """Orders already submitted, published again with the same message ids."""
        if count:
            await asyncio.to_thread(
                self.fleet.cli,
                "submit",
                "--json",
                "--count",
                str(count),
                "--seed",
                str(self.seed * 1000),
            )

    async def _poison(self, fault: Fault) -> None:
        """Messages no contract accepts: on the orders queue and on an agent's queue."""
        names = Names(self.hub)
        connection = await self._broker()
        try:
            sender = await connection.sender(timeout=30)
            for i in range(int(fault.amount)):
                body = POISON_BODIES[i % len(POISON_BODIES)]
                message = Outgoing(
                    body,
                    message_id=f"poison-{self.seed}-{i}",
                    type="order.submit",
                    user_id="guest",
                )
                if i % 2:
                    where = {"exchange": names.exchange, "routing_key": names.agent(AGENTS[i % 3])}
                else:
                    where = {"exchange": names.submit, "routing_key": ""}
                with contextlib.suppress(PublishRejected):  # a full queue refuses, as before
                    await sender.publish(message, **where)
        finally:
            await connection.close()

    async def _broker(self, timeout: float = 180) -> Connection:
        """A connection to the private broker, once it takes one (another fault may have
        stopped it)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                return await connect(self.mq.url, timeout=5, name="nemesis")
            except Exception:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.5)


async def until(moment: float) -> None:
    """Wait until `time.monotonic()` is `moment`."""
    delay = moment - time.monotonic()
    if delay > 0:
        await asyncio.sleep(delay)


def shifted(seconds: float) -> dict[str, str]:
    """Settings of a process whose wall clock is `seconds` off the machine's (libfaketime,
    Debian's `faketime`); its monotonic clock is left alone."""
    if not LIBFAKETIME.exists():
        raise RuntimeError(f"{LIBFAKETIME} is needed for a clock jump: apt-get install faketime")
    return {
        "LD_PRELOAD": str(LIBFAKETIME),
        "FAKETIME": f"{seconds:+.1f}s",
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
        "FAKETIME_NO_CACHE": "1",
    }
