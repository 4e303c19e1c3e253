"""`orderflow simulate`: the whole topology in one process, under virtual time, from one seed.

Submission, two schedulers, two supervisors, the three agents and the remote service run as
tasks of one event loop (harness/simulation/loop.py) on the reference store and broker in
memory (harness/simulation/world.py). The seed decides everything random: the orders and when
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
import logging
import random
from collections import Counter
from collections.abc import Coroutine
from typing import Any

from harness.remote.accounts import hub_account
from harness.remote.app import Faults, RemoteService
from harness.remote.ledger import Ledger
from harness.remote.local import LocalRemote
from harness.simulation import loop as virtual
from harness.simulation.faults import Striker, Wire
from harness.simulation.judge import Outcome, judge, settle
from harness.simulation.plan import HUB, PLACING_S, SETTLE_S, TOPOLOGY, Plan, settings_for
from harness.simulation.shop import Placed, Shop
from harness.simulation.world import ProcessClock, StoreHandle, StoreLink, World
from services.operator.cancellation import cancel_order, status_teller
from shared import clock
from shared.bootstrap import open_publisher
from shared.broker.memory import MemoryBroker, MemoryConnection, connect
from shared.broker.topology import Names, QueuePolicy, declare_topology
from shared.config import Settings
from shared.domain.models import StateRecord
from shared.errors import PublishError, ServiceUnavailable, StoreUnavailable
from shared.reporting import Reporter

__all__ = ["HUB", "Outcome", "initialise", "settings_for", "simulate"]


class _Errors(logging.Handler):
    """Counts what the processes log at ERROR or above, by message."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.counts: Counter[str] = Counter()

    def emit(self, record: logging.LogRecord) -> None:
        error = record.exc_info[1] if record.exc_info else None
        cause = f" ({type(error).__name__}: {str(error)[:80]})" if error is not None else ""
        self.counts[record.getMessage()[:120] + cause] += 1


WALL_S = 60.0
"""Real seconds a run may take (a seed takes about a tenth of one): a safety net for work the
loop budget cannot see, such as a loop without an await."""
ROUNDS = 300_000
"""Rounds of the event loop a run may take (a seed takes about 3,000 to 15,000): past them it
is a livelock, reported as a violation rather than left to run for ever."""


def simulate(seed: int, *, orders: int = 8, faults: int = 6) -> Outcome:
    """Run one seed on a fresh virtual-time loop."""
    rng = random.Random(seed)
    plan = Plan.of(rng, seed, orders=orders, faults=faults)
    settings = plan.settings
    outcome = Outcome(seed, orders, faults, plan.conditions, plan.schedule)
    errors = _Errors()
    root = logging.getLogger()
    # The processes' lines are counted in the outcome, not printed (thousands a run).
    level, handlers = root.level, root.handlers
    root.handlers, root.level = [errors], logging.ERROR
    random.seed(seed)  # every jitter the processes draw from the process-wide generator
    try:
        virtual.run(_simulate(outcome, settings, rng), budget=ROUNDS, wall_s=WALL_S)
    except (virtual.Runaway, virtual.Stalled, virtual.OutOfTime) as exc:
        outcome.violations.append(f"run: {type(exc).__name__}: {exc}")
    finally:
        root.handlers, root.level = handlers, level
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
        Ledger(":memory:"),
        calm,
        random.Random(rng.getrandbits(64)),
        admin_token=None,
        accounts=hub_account(settings),
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
    cancelling = random.Random(f"cancel-times:{seed}")
    for placed_order in cancelling.sample(placed, min(outcome.conditions.cancels, len(placed))):
        cancel = _after_recorded(world, placed_order.order_id, _cancel(world, placed_order))
        placing.append(_later(cancelling.uniform(0, PLACING_S * 3), cancel))
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
    outcome.settled_after_s = await settle(world, shop, deadline=calm_since + SETTLE_S)
    if outcome.settled_after_s is not None:
        outcome.settled_after_s -= calm_since
    await judge(world, shop, outcome)
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


async def _cancel(world: World, placed: Placed) -> None:
    """The order's customer cancels it, through a store connection of its own (as the shop's
    API would): a store outage fails the request, as it would the API's. The application is
    told over a broker connection of its own, when the broker is up: the status message is a
    notification, and the store holds what happened."""
    store: Any = StoreHandle(world.store, world)

    async def tell(record: StateRecord) -> None:
        connection = connect(world.broker, world.user_of("operator"), name="customer")
        try:
            publisher = await open_publisher(world.settings, connection)
            await status_teller(Reporter(store, publisher, Names(HUB), "customer"))(record)
        except (ServiceUnavailable, PublishError):  # as the publisher raises them
            pass  # the broker is down: the shop is not told (its order is Cancelled)
        finally:
            await connection.close()

    try:
        outcome = await cancel_order(store, placed.order_id, by="customer", tell=tell)
    except StoreUnavailable:
        return  # the customer's request failed; the order goes on as if it was never made
    placed.cancelled = outcome.done


async def initialise(world: World) -> None:
    """`orderflow init` on the memory servers."""
    await world.store.init()
    connection = MemoryConnection(world.broker, f"{HUB}-admin", name="init")
    s = world.settings
    policy = QueuePolicy(
        quorum=True,
        delivery_limit=s.broker.redelivery_limit,
        orders_max_length=s.broker.orders_queue_max_length,
        alerts_max_length=s.broker.alerts_queue_max_length,
    )
    await declare_topology(await connection.admin(), Names(HUB), policy)
    await connection.close()
