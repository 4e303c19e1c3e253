"""The nemesis's schedule: faults drawn from the whole catalogue by a seed, the same every time.

A schedule is data, made before anything runs: the seed alone decides which faults strike,
where, when and for how long, so a failing seed replays the same schedule anywhere (what the
processes make of it still depends on timing: the search repeats a seed to pin a failure).
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass
from enum import StrEnum
from typing import Any

from shared.domain.workflow import AGENTS


class Kind(StrEnum):
    KILL = "kill"
    """kill -9 of one process, restarted after the duration."""
    BROKER_RESTART = "broker-restart"
    """RabbitMQ's application stopped (every connection dropped) for the duration."""
    STORE_RESTART = "store-restart"
    """PostgreSQL stopped (fast shutdown) for the duration."""
    REMOTE_OUTAGE = "remote-outage"
    """Every remote call answers 503 for the duration."""
    REMOTE_HANGS = "remote-hangs"
    """A share of remote calls hang (then apply or are fenced off) for the duration."""
    DUPLICATES = "duplicates"
    """A batch of orders published again with the same message ids, and a scheduler that
    publishes every message twice for the duration."""
    LATE_REPLIES = "late-replies"
    """An agent whose replies are held back past their step's deadline for the duration."""
    POISON = "poison"
    """Messages no contract accepts, on the orders queue and an agent's queue."""
    CLOCK_JUMP = "clock-jump"
    """A supervisor or an agent restarted with its wall clock shifted, for the duration."""


CATALOGUE = tuple(Kind)

KILLABLE = (
    "submission",
    "scheduler-1",
    "scheduler-2",
    "supervisor-1",
    "supervisor-2",
    *(f"{agent}-1" for agent in AGENTS),
    "remote",
)
"""Every process of the nemesis's topology, each a target of `kill`."""
AGENT_PROCESSES = tuple(f"{agent}-1" for agent in AGENTS)
CLOCKED = ("supervisor-1", "supervisor-2", *AGENT_PROCESSES)


@dataclass(frozen=True)
class Fault:
    at_s: float
    """Seconds after the first orders were submitted."""
    kind: Kind
    duration_s: float
    target: str | None = None
    """The process, where the fault has one."""
    amount: float = 0.0
    """The fault's size: a share of calls (hangs), a clock shift in seconds (clock jump), a
    count of messages (duplicates, poison)."""

    def describe(self) -> str:
        where = f" {self.target}" if self.target else ""
        size = {
            Kind.REMOTE_HANGS: f", {self.amount:.0%} of calls",
            Kind.CLOCK_JUMP: f", {self.amount:+.1f} s",
            Kind.DUPLICATES: f", {self.amount:.0f} orders again",
            Kind.POISON: f", {self.amount:.0f} messages",
        }.get(self.kind, "")
        return f"t+{self.at_s:5.1f}s {self.kind}{where} for {self.duration_s:.1f} s{size}"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


POISON_BODIES = (b"{not json", b"[]", b'{"schema_version": 1}', b"\xff\xfe", b"{}" * 40)
"""What a POISON fault publishes, in turn: bodies no contract accepts."""


def draw(
    seed: int | random.Random,
    faults: int,
    *,
    span_s: float,
    clock_skew_s: float,
    longest_s: float = 6.0,
) -> list[Fault]:
    """`faults` faults from the catalogue, struck within `span_s` seconds, each lasting up to
    `longest_s`, in time order. Every kind is drawn alike; the first ones cover the catalogue
    when there are enough of them, so a schedule of nine faults or more tries each kind at
    least once."""
    rng = seed if isinstance(seed, random.Random) else random.Random(seed)
    kinds = list(CATALOGUE)
    rng.shuffle(kinds)
    chosen = kinds[:faults] + [rng.choice(CATALOGUE) for _ in range(faults - len(kinds))]
    schedule = [_one(rng, kind, span_s, clock_skew_s, longest_s) for kind in chosen]
    return sorted(schedule, key=lambda f: (f.at_s, f.kind))


def _one(rng: random.Random, kind: Kind, span_s: float, skew: float, longest_s: float) -> Fault:
    at = round(rng.uniform(0, span_s), 1)
    duration = round(rng.uniform(0.5, longest_s), 1)
    if kind is Kind.KILL:
        return Fault(at, kind, duration, target=rng.choice(KILLABLE))
    if kind is Kind.REMOTE_HANGS:
        return Fault(at, kind, duration, amount=round(rng.uniform(0.1, 0.5), 2))
    if kind is Kind.DUPLICATES:
        return Fault(
            at,
            kind,
            duration,
            target=rng.choice(("scheduler-1", "scheduler-2")),
            amount=rng.randint(1, 10),
        )
    if kind is Kind.LATE_REPLIES:
        return Fault(at, kind, duration, target=rng.choice(AGENT_PROCESSES))
    if kind is Kind.POISON:
        return Fault(at, kind, 0.0, amount=rng.randint(1, 20))
    if kind is Kind.CLOCK_JUMP:
        # Within twice the tolerated skew either way: within it nothing live may be recovered,
        # beyond it only time may be lost, never an invariant.
        shift = round(rng.uniform(-2 * skew, 2 * skew), 1)
        return Fault(at, kind, duration, target=rng.choice(CLOCKED), amount=shift)
    return Fault(at, kind, duration)
