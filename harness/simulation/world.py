"""The simulated world: one store, one broker, one remote service, and the processes on them.

Every process is the real one (`serve_submission`, `serve_scheduler`, `serve_supervisor`,
`serve_agent`) on the reference adapters in memory, run as tasks of one event loop. Each has:

- its own clock (shared/clock.py), the loop's virtual time plus an offset that a clock jump moves;
- its own broker connection, as its own broker user (the compose deployment's: one per role), so
  every receiver's check of who sent a message runs as in production;
- its own handle on the shared store, which a crash severs and an outage fails.

A crash is what `kill -9` leaves: the process's connection drops (the broker returns what it
held and deletes its private queues), its store handle fails every call, and every task it
started is cancelled (what they still try in their cleanup fails: a dead process does nothing
more). Its store and broker state stay; a restart is a new process of the same name.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import random
from collections.abc import Callable, Coroutine
from typing import Any, cast

from harness.remote.local import LocalRemote
from services.agents.agent import serve_agent
from services.scheduler.service import serve_scheduler
from services.submission.service import serve_submission
from services.supervisor.service import serve_supervisor
from shared import clock
from shared.bootstrap import Runtime
from shared.broker.memory import MemoryBroker, MemoryConnection
from shared.config import Settings
from shared.errors import StoreUnavailable
from shared.store.memory import MemoryStore
from shared.store.port import StateStore

log = logging.getLogger(__name__)

PROCESS: contextvars.ContextVar[SimProcess | None] = contextvars.ContextVar(
    "orderflow_simulated_process", default=None
)
"""The simulated process a task belongs to (set in each process's context)."""

RESTART_DELAY_S = 2.0
"""How long a process that exited waits before it is started again (compose restarts it)."""
EPOCH = 1_790_000_000.0
"""Wall-clock seconds at virtual time 0 (a fixed date, so runs repeat to the millisecond)."""


class ProcessClock:
    """A process's clock: virtual time, its wall clock moved by `offset` (a clock jump)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self.offset = 0.0

    def wall(self) -> float:
        return EPOCH + self._loop.time() + self.offset

    def monotonic(self) -> float:
        return self._loop.time()


class StoreLink:
    """The network between the processes and the store: a share of calls takes its time on
    the way there and back (so processes' calls interleave as over connections), seeded."""

    def __init__(self, rng: random.Random, *, slow_rate: float, max_latency_s: float) -> None:
        self._rng = rng
        self.slow_rate = slow_rate
        self.max_latency_s = max_latency_s

    def latency(self) -> tuple[float, float]:
        """(seconds on the way there, seconds on the way back) of one call."""
        if not self.slow_rate or self._rng.random() >= self.slow_rate:
            return 0.0, 0.0
        return self._rng.uniform(0, self.max_latency_s), self._rng.uniform(0, self.max_latency_s)


class StoreHandle:
    """One process's way to the shared store: every call fails once the process is dead, or
    while the store is out (`World.store_down`), as a connection to a server that is gone. A
    call whose answer is on its way back when that happens has been applied all the same: its
    caller sees an outage of unknown outcome."""

    def __init__(self, store: MemoryStore, world: World) -> None:
        self._store = store
        self._world = world
        self.dead = False

    def _check(self) -> None:
        if self.dead:
            raise StoreUnavailable("the connection is gone (this process died)")
        if self._world.store_down:
            raise StoreUnavailable("the store is unavailable (simulated outage)")

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._store, name)
        if not callable(attribute):
            return attribute

        async def call(*args: Any, **kwargs: Any) -> Any:
            self._check()
            there, back = self._world.link.latency()
            if there:
                await asyncio.sleep(there)
                self._check()
            result = await attribute(*args, **kwargs)
            if back:
                await asyncio.sleep(back)
                self._check()  # applied, but the answer is lost
            return result

        self.__dict__[name] = call  # found directly from now on
        return call


Serve = Callable[[Runtime, asyncio.Event], Coroutine[Any, Any, None]]


class SimProcess:
    """One process of the topology: started, crashed and restarted by the simulation."""

    def __init__(self, world: World, kind: str, name: str) -> None:
        self.world = world
        self.kind = kind
        self.name = name
        self.clock = ProcessClock(world.loop)
        self.tasks: dict[asyncio.Task[Any], None] = {}
        """In the order they were made (a set would order them by address: a crash would
        cancel them in another order on every run)."""
        self.alive = False
        self.starts = 0
        self.exits: list[str] = []
        """Why the process exited on its own, each time it did."""
        self._store: StoreHandle | None = None
        self._connection: MemoryConnection | None = None
        self._main: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.alive = True
        self.starts += 1
        self._store = StoreHandle(self.world.store, self.world)
        self._connection = MemoryConnection(self.world.broker, self.world.user_of(self.kind))
        context = contextvars.copy_context()
        context.run(clock.CLOCK.set, self.clock)
        context.run(PROCESS.set, self)
        self._main = self.world.loop.create_task(self._serve(), context=context)

    async def _serve(self) -> None:
        """Run the process; if it exits (it could not connect: the broker was out when it
        started), it is started again after a pause, as compose's restart policy does."""
        assert self._store is not None and self._connection is not None
        settings = self.world.settings_of(self.kind)
        store = cast(StateStore, self._store)
        try:
            runtime = await Runtime.on(settings, self.name, store, self._connection)
            await self.world.serve_of(self.kind)(runtime, asyncio.Event())
        except Exception as exc:
            self.exits.append(f"{type(exc).__name__}: {exc}"[:200])
        if self.alive:  # it exited on its own (a crash cancels it, and restarts it later)
            self.world.loop.call_later(RESTART_DELAY_S, self._restart)

    def _restart(self) -> None:
        if self.alive:
            self.crash()
            self.start()

    def crash(self) -> None:
        """Die at once, wherever each task is."""
        if not self.alive:
            return
        self.alive = False
        assert self._store is not None and self._connection is not None
        self._store.dead = True
        self._connection.sever()  # before its consumers get anything more
        for task in list(self.tasks):
            task.cancel()

    def track(self, task: asyncio.Task[Any]) -> None:
        self.tasks[task] = None
        task.add_done_callback(self._forget)

    def _forget(self, task: asyncio.Task[Any]) -> None:
        self.tasks.pop(task, None)

    def lingering(self) -> list[asyncio.Task[Any]]:
        """Tasks of a dead process still running (a process that ignores being cancelled)."""
        return [t for t in self.tasks if not t.done()] if not self.alive else []


def _task_factory(
    loop: asyncio.AbstractEventLoop,
    coro: Coroutine[Any, Any, Any],
    *,
    context: contextvars.Context | None = None,
) -> asyncio.Task[Any]:
    """Every task belongs to the process whose context created it (or was handed to it)."""
    task: asyncio.Task[Any] = asyncio.Task(coro, loop=loop, context=context)
    owner = context.get(PROCESS) if context is not None else PROCESS.get()
    if owner is not None:
        owner.track(task)
    return task


class World:
    """The shared servers and the processes of one simulated topology."""

    def __init__(
        self, settings: Settings, remote: LocalRemote, broker: MemoryBroker, link: StoreLink
    ) -> None:
        self.loop = asyncio.get_running_loop()
        self.link = link
        self.loop.set_task_factory(_task_factory)  # type: ignore[arg-type]
        self.settings = settings
        self.store = MemoryStore()
        self.broker = broker
        self.remote = remote
        self.store_down = False
        self.processes: dict[str, SimProcess] = {}
        self._settings: dict[str, Settings] = {}

    def user_of(self, kind: str) -> str:
        """The broker user of a kind of process (the compose deployment's naming)."""
        return f"{self.settings.hub}-{kind}"

    def settings_of(self, kind: str) -> Settings:
        """The settings of a kind of process: the world's, logging in as its own user."""
        if kind not in self._settings:
            url = f"amqp://{self.user_of(kind)}@memory/"
            self._settings[kind] = self.settings.replace(rabbitmq_url=url)
        return self._settings[kind]

    def serve_of(self, kind: str) -> Serve:
        if kind == "submission":
            return serve_submission
        if kind == "scheduler":
            return serve_scheduler
        if kind == "supervisor":
            return serve_supervisor
        agent = kind.removeprefix("agent-")

        async def serve(runtime: Runtime, stop: asyncio.Event) -> None:
            await serve_agent(agent, runtime, stop, client=self.remote)

        return serve

    def add(self, kind: str, name: str) -> SimProcess:
        process = SimProcess(self, kind, name)
        self.processes[name] = process
        return process
