"""Clocks that disagree: deadlines are set by one host and judged by another.

The supervisor runs 5 s ahead and the payment agent 5 s behind (libfaketime, Debian's
`faketime`, preloaded into their processes), every remote call takes long enough that each step
ends close to its deadline, and the tolerated skew (`ORDERFLOW_CLOCK_SKEW_S`) is 6 s: no live
attempt may be recovered, no request dropped.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from shared.domain.journal import HistoryEventType
from shared.domain.states import ProcessState
from tests.faults.conftest import FaultRun, everywhere
from tests.support.topology import Topology

pytestmark = [pytest.mark.rabbitmq, pytest.mark.postgres, pytest.mark.faults]

LIBFAKETIME = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1")


def shifted(offset: str) -> dict[str, str]:
    """The environment of a process whose wall clock is `offset` (`+5s`) from the machine's;
    its monotonic clock is left alone (what it times with is its own)."""
    if not LIBFAKETIME.exists():
        pytest.fail(f"{LIBFAKETIME} is needed: apt-get install faketime", pytrace=False)
    return {
        "LD_PRELOAD": str(LIBFAKETIME),
        "FAKETIME": offset,
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
        "FAKETIME_NO_CACHE": "1",
    }


async def test_a_supervisor_ahead_and_an_agent_behind_recover_nothing_live(
    topo: Topology,
) -> None:
    run = FaultRun(topo, "supervisor 5 s ahead, payment agent 5 s behind")
    everywhere(
        topo,
        ORDERFLOW_CLOCK_SKEW_S="6",
        ORDERFLOW_STEP_TIMEOUT_S="8",
        ORDERFLOW_INBOX_CLAIM_TTL_S="12",
        ORDERFLOW_HANDLER_TIMEOUT_S="10",
        ORDERFLOW_AGENT_HTTP_TIMEOUT_S="8",
        ORDERFLOW_LEASE_TTL_S="3",
    )
    topo.serve("supervisor-1", "supervisor", **shifted("+5s"))
    topo.serve("payment", "agent", "payment", **shifted("-5s"))
    # Every call takes 4 s: a step's reply comes 4 s before its deadline, which a supervisor 5 s
    # ahead sees as 1 s past it.
    await topo.start_all(ORDERFLOW_REMOTE_LATENCY_MS="4000")
    run.struck()
    run.submit(12, seed=71)
    states = await run.settle(timeout=120)
    assert all(s.process_state is ProcessState.PROCESSED for s in states)
    for order_id in run.order_ids:
        recovered = await topo.history(order_id, HistoryEventType.RECOVERED)
        expired = await topo.history(order_id, HistoryEventType.DEADLINE_EXPIRED)
        assert not recovered, f"{order_id}: a live attempt was recovered: {recovered}"
        assert not expired, f"{order_id}: a request went unanswered past its deadline"
    assert "deadline passed before the agent got the request" not in topo.logs("payment")
