"""Many seeds: a range of them simulated one after the other, or side by side in processes."""

from __future__ import annotations

import multiprocessing
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from functools import partial

from harness.simulation.run import Outcome, simulate


@dataclass
class Tally:
    """What a range of seeds came to."""

    seeds: int = 0
    violated: list[int] = field(default_factory=list)
    violations: Counter[str] = field(default_factory=Counter)
    """By invariant (`1`-`6`, `run` for a livelock or a stall)."""
    states: Counter[str] = field(default_factory=Counter)
    faults: int = 0
    virtual_s: float = 0.0
    wall_s: float = 0.0

    def add(self, outcome: Outcome) -> None:
        self.seeds += 1
        self.faults += len(outcome.schedule)
        self.virtual_s += outcome.virtual_s
        self.states.update(outcome.states)
        if not outcome.ok:
            self.violated.append(outcome.seed)
            self.violations.update(v.partition(":")[0] for v in outcome.violations)

    def summary(self) -> str:
        rate = self.seeds / self.wall_s * 60 if self.wall_s else 0.0
        return (
            f"{self.seeds} seeds, {len(self.violated)} violated {dict(self.violations)}; "
            f"{self.faults} faults; {self.virtual_s / 3600:.1f} virtual hours in "
            f"{self.wall_s:.1f} s ({rate:.0f} seeds a minute); orders "
            f"{dict(sorted(self.states.items()))}"
        )


def outcomes(
    first: int, count: int, *, orders: int, faults: int, jobs: int = 1
) -> Iterator[Outcome]:
    """The outcome of every seed from `first`, in seed order, `jobs` processes at a time."""
    seeds = range(first, first + count)
    run = partial(simulate, orders=orders, faults=faults)
    if jobs <= 1:
        yield from map(run, seeds)
        return
    # Forked workers start at once (spawned ones would import everything again, a second or
    # more each); a simulation holds no thread, lock or connection a fork could break.
    context = multiprocessing.get_context("fork")
    with ProcessPoolExecutor(jobs, mp_context=context) as pool:
        yield from pool.map(run, seeds, chunksize=max(1, min(25, count // (jobs * 4))))


def tally(first: int, count: int, *, orders: int, faults: int, jobs: int = 1) -> Tally:
    started = time.perf_counter()
    result = Tally()
    for outcome in outcomes(first, count, orders=orders, faults=faults, jobs=jobs):
        result.add(outcome)
    result.wall_s = time.perf_counter() - started
    return result
