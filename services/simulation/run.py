"""`orderflow simulate`: the whole topology in one process, under virtual time, from one seed.

Submission, two schedulers, two supervisors, the three agents and the remote service run as
tasks of one event loop (services/simulation/loop.py) on the reference store and broker in
memory (services/simulation/world.py). The seed decides everything random: the orders and when
the shop places them, the conditions of the run (remote transient errors and declines, messages
late, reordered or duplicated on the wire), the schedule of faults (the nemesis's catalogue:
kills of any process wherever its tasks are, broker, store and remote outages, hangs, late
replies, duplicates, poison, clock jumps), and every jitter the processes draw. The run ends
once every accepted order is settled (or the settle time is up), and is judged by the audit of
DESIGN §8 and the retry budget, and by what only the simulation sees: an accepted order the
store never recorded, a process that outlived its own crash.

A failing seed prints its conditions and its schedule, and runs again identically (the digest
of the final state is the same on every run of a seed).
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import hashlib
import logging
import random
from collections import Counter
from collections.abc import Coroutine
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from services.nemesis.schedule import Fault, Kind, draw
from services.operator.invariants import audit
from services.operator.views import all_states
from services.remote.app import Faults, RemoteService
from services.remote.ledger import Ledger
from services.remote.local import LocalRemote
from services.simulation import loop as virtual
from services.simulation.faults import Striker, Wire
from services.simulation.shop import Shop
from services.simulation.world import ProcessClock, StoreLink, World
from shared import clock
from shared.broker.memory import MemoryBroker, MemoryConnection
from shared.broker.topology import Names, QueuePolicy, declare_topology
from shared.config import Settings
from shared.domain.states import SETTLED_STATES

TOPOLOGY = (
    ("submission", "submission"),
    ("scheduler", "scheduler-1"),
    ("scheduler", "scheduler-2"),
    ("supervisor", "supervisor-1"),
    ("supervisor", "supervisor-2"),
    ("agent-inventory", "inventory-1"),
    ("agent-payment", "payment-1"),
    ("agent-shipping", "shipping-1"),
)
"""(kind, name) of every process: the nemesis's topology and names (its faults' targets)."""
HUB = "sim"
PLACING_S = 60.0
"""The shop places its orders within this many seconds of the start (while faults strike)."""
FAULT_SPAN_S = 60.0
LONGEST_FAULT_S = 45.0
SETTLE_S = 1800.0
"""Virtual seconds, after the last fault is lifted, for every accepted order to settle."""


@dataclass(frozen=True)
class Conditions:
    """What a run's seed decides beside its faults."""

    transient_rate: float
    decline_rate: float
    hang_s: float
    delay_rate: float
    max_delay_s: float
    duplicate_rate: float
    conflicts: int
    slow_store_rate: float
    max_store_latency_s: float
    kills: int
    """Kills beside the schedule's faults, quickly restarted: a process dying mid-work."""

    @classmethod
    def draw(cls, rng: random.Random, orders: int) -> Conditions:
        return cls(
            transient_rate=rng.choice((0.0, 0.0, 0.05, 0.2, 0.5)),
            decline_rate=rng.choice((0.0, 0.0, 0.2, 0.5)),
            hang_s=rng.choice((2.0, 15.0, 60.0)),
            delay_rate=rng.choice((0.0, 0.1, 0.5)),
            max_delay_s=rng.choice((0.01, 0.5, 5.0)),
            duplicate_rate=rng.choice((0.0, 0.0, 0.05, 0.3)),
            conflicts=rng.choice((0, 0, 1)) if orders else 0,
            slow_store_rate=rng.choice((0.0, 0.2, 0.8)),
            max_store_latency_s=rng.choice((0.002, 0.05, 1.0)),
            kills=rng.choice((0, 2, 6, 12)),
        )

    def describe(self) -> str:
        return (
            f"remote: {self.transient_rate:.0%} transient, {self.decline_rate:.0%} declined, "
            f"hangs of {self.hang_s:.0f} s; wire: {self.delay_rate:.0%} late by up to "
            f"{self.max_delay_s} s, {self.duplicate_rate:.0%} twice; store: "
            f"{self.slow_store_rate:.0%} of calls slow by up to {self.max_store_latency_s} s "
            f"each way; {self.conflicts} conflicts; {self.kills} quick kills"
        )


@dataclass
class Outcome:
    seed: int
    orders: int
    conditions: Conditions
    schedule: list[Fault]
    violations: list[str] = field(default_factory=list)
    states: dict[str, int] = field(default_factory=dict)
    virtual_s: float = 0.0
    settled_after_s: float | None = None
    """Virtual seconds from the last fault's end until every accepted order was settled."""
    errors: dict[str, int] = field(default_factory=dict)
    """Lines the processes logged at ERROR or above, by message."""
    dead_letters: dict[str, int] = field(default_factory=dict)
    calls: dict[str, int] = field(default_factory=dict)
    """The remote service's answers, by outcome (what the run made the agents meet)."""
    digest: str = ""

    @property
    def ok(self) -> bool:
        return not self.violations

    def report(self) -> str:
        head = (
            f"seed {self.seed}: {'ok' if self.ok else 'VIOLATED'}; {self.orders} orders "
            f"{self.states}; {self.virtual_s:.0f} virtual s; digest {self.digest[:12]}"
        )
        if self.ok:
            return head
        lines = [head, f"  conditions: {self.conditions.describe()}", "  schedule:"]
        lines += [f"    {fault.describe()}" for fault in self.schedule]
        lines += [f"  violation: {v}" for v in self.violations]
        lines += [f"  logged {n}x: {message}" for message, n in sorted(self.errors.items())]
        lines += [f"  dead letters: {self.dead_letters}"] if self.dead_letters else []
        lines.append(f"  rerun: orderflow simulate --seed {self.seed} --orders {self.orders} "
                     f"--faults {len(self.schedule)}")  # fmt: skip
        return "\n".join(lines)


@functools.cache
def _defaults() -> Settings:
    return Settings(
        _env_prefix="ORDERFLOW_SIMULATION_READS_NO_ENVIRONMENT_",
        _secrets_dir=None,
        hub=HUB,
        store_url="postgresql://simulated",
        seal_key="simulated-seal-key",
        poll_interval_s=POLL_INTERVAL_S,
    )


def settings_for(seed: int) -> Settings:
    """The simulation's settings: the defaults (not this environment's: a seed must run the
    same anywhere), in its own hub, with a seal key so dead letters are sealed as in a
    deployment, and the schedulers' idle poll at `POLL_INTERVAL_S`."""
    return _defaults().model_copy(update={"fault_seed": seed, "remote_seed": seed})


class _Errors(logging.Handler):
    """Counts what the processes log at ERROR or above, by message."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.counts: Counter[str] = Counter()

    def emit(self, record: logging.LogRecord) -> None:
        error = record.exc_info[1] if record.exc_info else None
        cause = f" ({type(error).__name__}: {str(error)[:80]})" if error is not None else ""
        self.counts[record.getMessage()[:120] + cause] += 1


POLL_INTERVAL_S = 1.0
"""How often an idle scheduler looks for work (the default, 0.2 s, costs a third of a run's
time in idle polls, and changes nothing a fault can reach: orders are claimed a little later)."""
WALL_S = 60.0
"""Real seconds a run may take (a seed takes about a tenth of one): a safety net for work the
loop budget cannot see, such as a loop without an await."""
ROUNDS = 300_000
"""Rounds of the event loop a run may take (a seed takes about 3,000 to 15,000): past them it
is a livelock, reported as a violation rather than left to run for ever."""


def simulate(seed: int, *, orders: int = 8, faults: int = 6) -> Outcome:
    """Run one seed on a fresh virtual-time loop."""
    rng = random.Random(seed)
    settings = settings_for(seed)
    conditions = Conditions.draw(rng, orders)
    schedule = draw(
        rng, faults, span_s=FAULT_SPAN_S, clock_skew_s=settings.clock_skew_s,
        longest_s=LONGEST_FAULT_S,
    )  # fmt: skip
    schedule = sorted(schedule + _kills(rng, conditions.kills), key=lambda f: f.at_s)
    outcome = Outcome(seed, orders, conditions, schedule)
    errors = _Errors()
    root = logging.getLogger()
    level = root.level
    root.addHandler(errors)
    root.setLevel(logging.ERROR)
    random.seed(seed)  # every jitter the processes draw from the process-wide generator
    try:
        virtual.run(_simulate(outcome, settings, rng), budget=ROUNDS, wall_s=WALL_S)
    except (virtual.Runaway, virtual.Stalled, virtual.OutOfTime) as exc:
        outcome.violations.append(f"run: {type(exc).__name__}: {exc}")
    finally:
        root.removeHandler(errors)
        root.setLevel(level)
    outcome.errors = dict(errors.counts)
    return outcome


async def _simulate(outcome: Outcome, settings: Settings, rng: random.Random) -> None:
    conditions = outcome.conditions
    loop = asyncio.get_running_loop()
    clock.CLOCK.set(ProcessClock(loop))  # the observer's clock: no offset
    wire = Wire(
        random.Random(rng.getrandbits(64)),
        delay_rate=conditions.delay_rate,
        max_delay_s=conditions.max_delay_s,
        duplicate_rate=conditions.duplicate_rate,
    )
    calm = Faults(
        transient_error_rate=conditions.transient_rate,
        decline_rate=conditions.decline_rate,
        hang_s=conditions.hang_s,
    )
    service = RemoteService(
        Ledger(":memory:"), calm, random.Random(rng.getrandbits(64)), admin_token=None
    )
    service.faults = Faults(**calm.__dict__)
    remote_context = contextvars.copy_context()
    remote_context.run(clock.CLOCK.set, ProcessClock(loop))
    remote = LocalRemote(service, account=HUB, context=remote_context)
    link = StoreLink(
        random.Random(rng.getrandbits(64)),
        slow_rate=conditions.slow_store_rate,
        max_latency_s=conditions.max_store_latency_s,
    )
    world = World(settings, remote, MemoryBroker(wire), link)
    try:
        await _run(world, rng, outcome, wire, calm, outcome.seed)
    finally:
        service.ledger.close()


def _kills(rng: random.Random, count: int) -> list[Fault]:
    """Kills while orders are placed, each restarted within seconds; any process."""
    names = [name for _, name in TOPOLOGY] + ["remote"]
    return [
        Fault(round(rng.uniform(0, PLACING_S), 1), Kind.KILL, round(rng.uniform(0.1, 5.0), 1),
              target=rng.choice(names))
        for _ in range(count)
    ]  # fmt: skip


async def _run(
    world: World,
    rng: random.Random,
    outcome: Outcome,
    wire: Wire,
    calm: Faults,
    seed: int,
) -> None:
    loop = asyncio.get_running_loop()
    await initialise(world)
    for kind, name in TOPOLOGY:
        world.add(kind, name).start()
    shop = Shop(world.broker, Names(HUB), random.Random(rng.getrandbits(64)))
    await shop.open()
    placing = [_later(rng.uniform(0, PLACING_S), shop.place(shop.order(i, seed))) for i in
               range(outcome.orders)]  # fmt: skip
    placed = list(shop.orders.values())
    for placed_order in rng.sample(placed, min(outcome.conditions.conflicts, len(placed))):
        conflict = _after_recorded(world, placed_order.order_id, shop.conflict(placed_order))
        placing.append(_later(rng.uniform(0, PLACING_S * 2), conflict))
    tasks = [shop.run(p) for p in placing]
    striker = Striker(
        world,
        shop,
        world.remote,
        wire,
        calm=calm,
        seed=seed,
        rng=random.Random(rng.getrandbits(64)),
    )
    tasks += [loop.create_task(_later(f.at_s, striker.strike(f))) for f in outcome.schedule]
    await asyncio.gather(*tasks)
    calm_since = loop.time()
    outcome.settled_after_s = await _settle(world, shop, deadline=calm_since + SETTLE_S)
    if outcome.settled_after_s is not None:
        outcome.settled_after_s -= calm_since
    await _judge(world, shop, outcome)
    outcome.virtual_s = loop.time()


async def _later(delay: float, work: Any) -> None:
    await asyncio.sleep(delay)
    await work


async def _after_recorded(world: World, order_id: str, work: Coroutine[Any, Any, None]) -> None:
    """`work` once the order is recorded (a conflicting submission must come second); not at
    all if it is not recorded in time (the judge reports the order lost)."""
    for _ in range(int(SETTLE_S)):  # the observer polls: nothing in the system tells it
        if await world.store.get_order(order_id) is not None:
            await work
            return
        await asyncio.sleep(1.0)
    work.close()


async def initialise(world: World) -> None:
    """`orderflow init` on the memory servers."""
    await world.store.init()
    connection = MemoryConnection(world.broker, f"{HUB}-admin", name="init")
    s = world.settings
    policy = QueuePolicy(
        quorum=True,
        delivery_limit=s.redelivery_limit,
        orders_max_length=s.orders_queue_max_length,
        alerts_max_length=s.alerts_queue_max_length,
    )
    await declare_topology(await connection.channel(), Names(HUB), policy)  # type: ignore[arg-type]
    await connection.close()


async def _settle(world: World, shop: Shop, *, deadline: float) -> float | None:
    """Virtual time when every accepted order was settled (None: not by the deadline)."""
    loop = asyncio.get_running_loop()
    accepted = {p.order_id for p in shop.orders.values() if p.accepted}
    while loop.time() < deadline:
        states = {s.order_id: s.process_state for s in await all_states(world.store)}
        if all(states.get(o) in SETTLED_STATES for o in accepted):
            return loop.time()
        await asyncio.sleep(1.0)
    return None


async def _judge(world: World, shop: Shop, outcome: Outcome) -> None:
    store = world.store
    states = {s.order_id: s for s in await all_states(store)}
    outcome.states = dict(sorted(Counter(s.process_state.value for s in states.values()).items()))
    for placed in shop.orders.values():
        state = states.get(placed.order_id)
        if not placed.accepted:
            continue
        if state is None:
            outcome.violations.append(f"1: {placed.order_id} accepted and never recorded")
        elif state.process_state not in SETTLED_STATES:
            outcome.violations.append(
                f"1: {placed.order_id} still {state.process_state} "
                f"{SETTLE_S:.0f} s after the last fault"
            )
        order = await store.get_order(placed.order_id)
        if order is not None and order.fingerprint != placed.fingerprint:
            outcome.violations.append(f"4: {placed.order_id} holds other data than it was placed")
    effects = await world.remote.ledger(account=HUB)
    attempts = await world.remote.attempts(account=HUB)
    report = await audit(
        store,
        effects,
        now=clock.utcnow(),
        grace=timedelta(seconds=world.settings.clock_skew_s * 2 + 1),
        attempts=attempts,
        undo_attempts=world.settings.undo_attempts,
    )
    outcome.violations += [
        f"{v['invariant']}: {v['order_id']}: {v['message']}" for v in report.violations
    ]
    for process in world.processes.values():
        if process.lingering():
            outcome.violations.append(f"{process.name} still runs tasks after its crash")
    outcome.dead_letters = await _dead_letters(world)
    outcome.calls = dict(sorted(Counter(str(a["outcome"]) for a in attempts).items()))
    outcome.digest = _digest(states.values(), effects)


async def _dead_letters(world: World) -> dict[str, int]:
    """What every dead-letter queue holds, by queue and reason."""
    names = Names(HUB)
    counts: Counter[str] = Counter()
    for base in names.input_queues():
        queue = world.broker.queues.get(names.dlq(base))
        for message in queue.ready if queue is not None else ():
            headers = world.broker.delivered(message).headers or {}
            reason = headers.get("x-orderflow-reason") or headers.get("x-death")
            counts[f"{base.removeprefix(HUB + '.')}:{reason!s}"] += 1
    return dict(sorted(counts.items()))


def _digest(states: Any, effects: list[dict[str, Any]]) -> str:
    """A fingerprint of how the run ended: every order's state and every effect, in order."""
    parts = [
        f"{s.order_id}|{s.process_state}|{s.attempt}|{s.failure_count}|"
        f"{[(n, st.status.value, st.attempts) for n, st in sorted(s.steps.items())]}"
        for s in sorted(states, key=lambda s: s.order_id)
    ]
    parts += [f"{e['seq']}|{e['order_id']}|{e['operation']}|{e['outcome']}" for e in effects]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()
