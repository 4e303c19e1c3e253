"""How a simulation ends and is judged: every accepted order settled (or not in time), the audit
of DESIGN §8 and the retry budget, and what only the simulation sees (an accepted order never
recorded, another order's data under an order's id, a process that outlived its own crash)."""

from __future__ import annotations

import asyncio
import hashlib
from collections import Counter
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from harness.nemesis.schedule import Fault
from harness.simulation.plan import HUB, SETTLE_S, Conditions
from harness.simulation.shop import Shop
from harness.simulation.world import World
from services.operator.invariants import audit, check_dead_letters
from services.operator.views import all_states
from shared import clock
from shared.broker.dead_letters import dead_letters
from shared.broker.memory import connect
from shared.broker.topology import Names
from shared.domain.states import SETTLED_STATES, ProcessState

CANCELLED_ENDS = frozenset(
    {ProcessState.CANCELLED, ProcessState.COMPENSATED, ProcessState.COMPENSATION_FAILED}
)
"""Where an order may end once its customer's cancellation was accepted."""


@dataclass
class Outcome:
    seed: int
    orders: int
    faults: int
    """Faults asked of the catalogue (the schedule holds them and the seed's quick kills)."""
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
                     f"--faults {self.faults}")  # fmt: skip
        return "\n".join(lines)


async def settle(world: World, shop: Shop, *, deadline: float) -> float | None:
    """Virtual time when every accepted order was settled (None: not by the deadline)."""
    loop = asyncio.get_running_loop()
    accepted = {p.order_id for p in shop.orders.values() if p.accepted}
    while loop.time() < deadline:
        states = {s.order_id: s.process_state for s in await all_states(world.store)}
        if all(states.get(o) in SETTLED_STATES for o in accepted):
            return loop.time()
        await asyncio.sleep(1.0)
    return None


async def judge(world: World, shop: Shop, outcome: Outcome) -> None:
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
        elif placed.cancelled and state.process_state not in CANCELLED_ENDS:
            outcome.violations.append(
                f"cancel: {placed.order_id} ended {state.process_state} after its "
                "cancellation was accepted"
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
        grace=timedelta(seconds=world.settings.process.clock_skew_s * 2 + 1),
        attempts=attempts,
        undo_attempts=world.settings.workflow.undo_attempts,
    )
    outcome.violations += _zombies(world)
    for process in world.processes.values():
        if process.lingering():
            outcome.violations.append(f"{process.name} still runs tasks after its crash")
    letters = await _dead_letters(world)
    check_dead_letters(report, letters)
    outcome.violations += [
        f"{v['invariant']}: {v['order_id']}: {v['message']}" for v in report.violations
    ]
    reasons = Counter(f"{d['queue'].removeprefix(HUB + '.')}:{d['reason']}" for d in letters)
    outcome.dead_letters = dict(sorted(reasons.items()))
    outcome.calls = dict(sorted(Counter(str(a["outcome"]) for a in attempts).items()))
    outcome.digest = _digest(states.values(), effects)


def _zombies(world: World) -> list[str]:
    """Connections the broker still has of processes that died: what they held or would be
    given is lost to every other consumer."""
    users = {world.user_of(p.kind) for p in world.processes.values()}
    alive = Counter(world.user_of(p.kind) for p in world.processes.values() if p.alive)
    open_ = Counter(c.user for c in world.broker.connections())
    return [
        f"run: {n} connections open as {user}, {alive[user]} of its processes alive"
        for user, n in sorted(open_.items())
        if user in users and n > alive[user]
    ]


async def _dead_letters(world: World) -> list[dict[str, Any]]:
    """Every dead letter, as `orderflow dlq list` reads them (as the operator's user)."""
    names = Names(HUB)
    connection = connect(world.broker, f"{HUB}-operator", name="judge")
    try:
        return await dead_letters(connection, names.input_queues())
    finally:
        await connection.close()


def _digest(states: Any, effects: list[dict[str, Any]]) -> str:
    """A fingerprint of how the run ended: every order's state and every effect, in order."""
    parts = [
        f"{s.order_id}|{s.process_state}|{s.attempt}|{s.failure_count}|"
        f"{[(n, st.status.value, st.attempts) for n, st in sorted(s.steps.items())]}"
        for s in sorted(states, key=lambda s: s.order_id)
    ]
    parts += [f"{e['seq']}|{e['order_id']}|{e['operation']}|{e['outcome']}" for e in effects]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()
