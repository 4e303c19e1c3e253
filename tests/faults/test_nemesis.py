"""`orderflow nemesis` in CI: a few fixed seeds, each a whole run on private servers with the
catalogue's faults, checked by the audit. A seed that failed anywhere joins `REGRESSIONS`."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.faults]

FIXED = [1, 2]
"""Seeds run on every CI run: each tries every kind of fault (nine faults)."""
REGRESSIONS: list[int] = []
"""Seeds that once failed, with the fix that made them pass (none yet)."""


@pytest.mark.parametrize("seed", FIXED + REGRESSIONS)
def test_a_seeded_nemesis_run_keeps_every_invariant(seed: int) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "services.cli", "nemesis", "--seed", str(seed), "--json"],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert done.stdout, done.stderr[-3000:]
    figures = json.loads(done.stdout)
    print("\n".join(f["text"] for f in figures["schedule"]))
    assert figures["submitted"] == figures["orders"]
    assert figures["lost"] == 0
    assert figures["duplicate_effects"] == 0
    assert figures["budget_overspends"] == 0
    assert figures["audit_violations"] == 0, figures["violations"]
    assert figures["settle_s"] is not None, "not every order settled"
    assert {f["kind"] for f in figures["schedule"]} >= {"kill", "broker-restart", "store-restart"}
    assert done.returncode == 0, done.stderr[-3000:]
