"""What a simulation's seed decides before anything runs: the settings, the conditions of the
run, and its schedule of faults (the nemesis's catalogue, and quick kills on top)."""

from __future__ import annotations

import dataclasses
import functools
import random
from dataclasses import dataclass

from harness.nemesis.schedule import Fault, Kind, draw
from shared.config import Settings

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


POLL_INTERVAL_S = 1.0
"""How often an idle scheduler looks for work (the default, 0.2 s, costs a third of a run's
time in idle polls, and changes nothing a fault can reach: orders are claimed a little later)."""


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
    cancels: int = 0
    """Orders their customer cancels, each at a random time: before it is claimed, during a
    step, while it is recovered or compensated, or after it finished (refused)."""

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
            f"each way; {self.conflicts} conflicts; {self.kills} quick kills; "
            f"{self.cancels} cancelled"
        )


@dataclass(frozen=True)
class Plan:
    settings: Settings
    conditions: Conditions
    schedule: list[Fault]

    @classmethod
    def of(cls, rng: random.Random, seed: int, *, orders: int, faults: int) -> Plan:
        settings = settings_for(seed)
        conditions = Conditions.draw(rng, orders)
        # Drawn apart, so that every seed's other conditions and schedule stay what they were
        # before cancellations came (the pinned regressions still run their own runs).
        cancels = random.Random(f"cancels:{seed}").choice((0, 1, 2, 3)) if orders else 0
        conditions = dataclasses.replace(conditions, cancels=cancels)
        schedule = draw(
            rng, faults, span_s=FAULT_SPAN_S, clock_skew_s=settings.process.clock_skew_s,
            longest_s=LONGEST_FAULT_S,
        )  # fmt: skip
        schedule += kills(rng, conditions.kills)
        return cls(settings, conditions, sorted(schedule, key=lambda f: f.at_s))


@functools.cache
def _defaults() -> Settings:
    return Settings(
        _env_prefix="ORDERFLOW_SIMULATION_READS_NO_ENVIRONMENT_",
        _secrets_dir=None,
        hub=HUB,
        store_url="postgresql://simulated",
        seal_key="simulated-seal-key",
        remote_account_key="simulated-account-key",
        remote_fence_key="simulated-fence-key",
        poll_interval_s=POLL_INTERVAL_S,
    )


def settings_for(seed: int) -> Settings:
    """The simulation's settings: the defaults (not this environment's: a seed must run the
    same anywhere), in its own hub, with a seal key so dead letters are sealed as in a
    deployment, the keys of the hub's account at the remote service (so fencing tokens are
    signed and checked as in a deployment), and the schedulers' idle poll at
    `POLL_INTERVAL_S`."""
    return _defaults().model_copy(update={"fault_seed": seed, "remote_seed": seed})


def kills(rng: random.Random, count: int) -> list[Fault]:
    """Kills while orders are placed, each restarted within seconds; any process."""
    names = [name for _, name in TOPOLOGY] + ["remote"]
    return [
        Fault(round(rng.uniform(0, PLACING_S), 1), Kind.KILL, round(rng.uniform(0.1, 5.0), 1),
              target=rng.choice(names))
        for _ in range(count)
    ]  # fmt: skip
