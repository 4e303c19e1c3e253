"""Round trips per order to MongoDB, counted on the stand-in: `python -m tests.support.mongo_trips`.

The simulation's whole topology (harness/simulation) runs calm (no fault, no remote error, no
late or duplicated message, no cancellation) with the MongoDB adapter over the in-process
stand-in (tests/support/mongo_standin.py) as its store instead of the memory store, and the
stand-in counts every command by collection, as PyMongo's command monitoring would count the
round trips. It is NOT a MongoDB server: what it counts is what the adapter sends.

Two runs, of `FEW` and `MANY` orders, and their difference divided by the difference in orders:
the background (heartbeats, leases, the schedulers' idle polls) cancels out, what is left is
what one more order costs. Every order has the workflow's three steps.
"""

from __future__ import annotations

import argparse
import dataclasses
import random
from collections import Counter
from typing import Any

import bson

from harness.simulation import run as simulation
from harness.simulation.plan import Conditions, Plan
from harness.simulation.world import World
from shared.store.mongo import MongoStore
from tests.support.mongo_standin import StandInClient, StandInServer

FEW = 10
MANY = 40
ORDER_PATH = ("orders", "state", "history", "compensation_log", "counters", "inbox")
"""The collections an order's own commands go to; the rest are the processes' background."""

CALM = Conditions(
    transient_rate=0.0,
    decline_rate=0.0,
    hang_s=2.0,
    delay_rate=0.0,
    max_delay_s=0.01,
    duplicate_rate=0.0,
    conflicts=0,
    slow_store_rate=0.0,
    max_store_latency_s=0.002,
    kills=0,
    cancels=0,
)


RETRYING = dataclasses.replace(CALM, transient_rate=0.5, decline_rate=0.2)
"""Half the remote calls fail for a while, a fifth are declined: steps retried, orders undone."""


@dataclasses.dataclass
class Run:
    trips: Counter[tuple[str, str]]
    """The commands by (command, collection) the run sent before it was judged."""
    sizes: dict[str, list[int]]
    """The BSON sizes of the finished orders' state records, by their state."""
    violations: list[str]


def run(orders: int, seed: int = 1, conditions: Conditions = CALM) -> Run:
    """A run of `orders` orders under `conditions` (no fault) on the stand-in."""
    server = StandInServer()

    class _Plan(Plan):
        @classmethod
        def of(cls, rng: random.Random, seed: int, *, orders: int, faults: int) -> Plan:
            plan = Plan.of(rng, seed, orders=orders, faults=0)
            return dataclasses.replace(plan, conditions=conditions, schedule=[])

    initialise, judge = simulation.initialise, simulation.judge
    before_judging: Counter[tuple[str, str]] = Counter()

    async def on_the_stand_in(world: World) -> None:
        store: Any = await MongoStore.open(StandInClient(server), world.settings.hub)
        world.store = store
        await initialise(world)
        server.trips.clear()  # `init`'s indexes and the like are no order's

    async def counted_first(*args: Any) -> None:
        before_judging.update(server.trips)  # the judge's reads are no order's either
        await judge(*args)

    simulation.initialise = on_the_stand_in  # type: ignore[assignment]
    simulation.judge = counted_first
    simulation.Plan = _Plan  # type: ignore[misc]
    try:
        outcome = simulation.simulate(seed, orders=orders, faults=0)
    finally:
        simulation.initialise, simulation.judge = initialise, judge  # type: ignore[assignment]
        simulation.Plan = Plan  # type: ignore[misc]
    counted: Counter[tuple[str, str]] = Counter()
    for (command, collection), n in before_judging.items():
        counted[command, collection.rpartition(".")[2]] += n
    if not outcome.settled_after_s and outcome.settled_after_s != 0:
        outcome.violations.append("the orders did not settle")
    sizes: dict[str, list[int]] = {}
    for name in server.mm.list_database_names():
        for collection in server.mm[name].list_collection_names():
            if collection.rpartition(".")[2] != "state":
                continue
            for doc in server.mm[name][collection].find():
                sizes.setdefault(doc["process_state"], []).append(len(bson.encode(doc)))
    return Run(counted, sizes, outcome.violations)


def per_order(few: int = FEW, many: int = MANY) -> dict[tuple[str, str], float]:
    """What one more order costs, by (command, collection)."""
    small, large = run(few), run(many)
    if small.violations or large.violations:
        raise SystemExit(f"the calm runs found violations: {small.violations + large.violations}")
    keys = set(small.trips) | set(large.trips)
    return {k: (large.trips[k] - small.trips[k]) / (many - few) for k in sorted(keys)}


def _sizes(title: str, found: Run) -> None:
    print(title)
    for state, sizes in sorted(found.sizes.items()):
        sizes.sort()
        median, largest = sizes[len(sizes) // 2], sizes[-1]
        print(f"  {state:<13} {len(sizes):3} orders: median {median:6} B, largest {largest:6} B")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--few", type=int, default=FEW)
    parser.add_argument("--many", type=int, default=MANY)
    args = parser.parse_args()
    costs = per_order(args.few, args.many)
    path = {k: v for k, v in costs.items() if k[1] in ORDER_PATH}
    print(f"MongoDB commands per order (stand-in, {args.many} - {args.few} orders, 3 steps each)")
    for (command, collection), n in path.items():
        print(f"  {collection:<18} {command:<14} {n:6.2f}")
    writing = {"insert", "update", "findAndModify", "delete"}
    writes = sum(n for (c, _), n in path.items() if c in writing)
    print(f"  order-path writes   {writes:6.2f}")
    print(f"  order-path total    {sum(path.values()):6.2f}")
    rest = sum(v for k, v in costs.items() if k[1] not in ORDER_PATH)
    print(f"  background (other collections), per order: {rest:6.2f}")
    _sizes("State record sizes (BSON), calm:", run(args.many))
    _sizes(
        "State record sizes (BSON), with retries and declines:", run(args.many, conditions=RETRYING)
    )


if __name__ == "__main__":
    main()
