"""The simulation over fixed seed ranges (harness/simulation): the whole topology on the memory
adapters under virtual time, every seed judged by the audit of DESIGN §8 and the retry budget.

A seed that fails prints its conditions and schedule (`Outcome.report`); rerun it with
`orderflow simulate --seed S`, and pin it in `REGRESSIONS` once what it found is fixed.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from harness.simulation.run import simulate
from harness.simulation.seeds import outcomes
from services.agents.attempts import Allowance

SEEDS = int(os.environ.get("ORDERFLOW_TEST_SIMULATED_SEEDS", "2000"))
"""Seeds CI runs (from 0); more locally: ORDERFLOW_TEST_SIMULATED_SEEDS=20000."""
JOBS = min(2, os.cpu_count() or 1)

REGRESSIONS: list[tuple[int, int, int]] = [
    # Two accepted orders never recorded: a process restarted by the harness (it had exited,
    # started while the broker was out) cancelled the task closing its old connection, whose
    # consumer kept a delivery in hand for ever. A harness bug; the judge now also counts
    # connections that outlive their process.
    (100333, 16, 12),
    # An accepted order dead-lettered `redelivery-limit`: its submission process died handling
    # it, and each later delivery waited in hand (up to the claim's 30 s) for the claim the
    # dead one had left; four more deaths and a broker restart meanwhile each counted one
    # delivery (every return counts before RabbitMQ 4.3). Fixed: such a message waits out of
    # hand, uncounted (decision:message-never-waits-for-another-claim).
    (203491, 16, 12),
]
"""(seed, orders, faults) of every run that found a violation, once it was fixed."""


def test_every_seed_holds_every_invariant() -> None:
    failed = []
    seen = 0
    for outcome in outcomes(0, SEEDS, orders=8, faults=6, jobs=JOBS):
        seen += 1
        if not outcome.ok:
            failed.append(outcome.report())
    assert seen == SEEDS
    assert not failed, "\n".join(failed[:10])


@pytest.mark.parametrize(("seed", "orders", "faults"), REGRESSIONS)
def test_a_seed_that_once_failed_holds(seed: int, orders: int, faults: int) -> None:
    outcome = simulate(seed, orders=orders, faults=faults)
    assert outcome.ok, outcome.report()


def test_a_seed_runs_the_same_every_time() -> None:
    """The same seed ends in the same state, down to every effect's place in the ledger."""
    first, second = simulate(7), simulate(7)
    assert first.digest and first.digest == second.digest
    assert first.report() == second.report()
    assert (first.virtual_s, first.calls, first.states) == (
        second.virtual_s,
        second.calls,
        second.states,
    )


def test_a_seed_runs_the_same_in_another_process() -> None:
    """Another interpreter, with other string hashes, gets the same run."""
    script = "from harness.simulation.run import simulate; print(simulate(11).digest)"
    digests = {
        subprocess.run(
            [sys.executable, "-c", script],
            env={**os.environ, "PYTHONHASHSEED": str(hash_seed)},
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        for hash_seed in (1, 2)
    }
    assert digests == {simulate(11).digest}


def test_a_broken_guarantee_is_found_and_reported_with_its_schedule(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An agent that ignores its allowance overspends the retry budget: some seed says so."""

    async def always(self: Allowance) -> bool:
        self._next += 1
        return True

    monkeypatch.setattr(Allowance, "take", always)
    found = next((o for o in (simulate(seed) for seed in range(40)) if not o.ok), None)
    assert found is not None, "40 seeds and no overspent budget"
    report = found.report()
    assert any(v.startswith("6:") for v in found.violations), report
    assert "schedule:" in report and f"orderflow simulate --seed {found.seed}" in report
