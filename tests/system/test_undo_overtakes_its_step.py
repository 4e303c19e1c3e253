"""An undo cannot be overtaken by its own step (issue 14), through real processes.

The reserve step's first call hangs inside the remote service. The agent gives up on it (its
HTTP timeout) and calls again; that call is refused for good (the `reject_operations` knob: a
permanent failure that, unlike a decline, is no outcome of the key), so the attempt fails
permanently and compensates at once, under its own fencing token: the release is recorded as a
no-op, since no reservation exists yet. Then the hung call wakes. The fencing token cannot stop
it (it is the compensating attempt's own); the remote service must, because an undo commutes
with the call it undoes. At the end no reservation stands without its release, and
`orderflow audit` agrees.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from shared.domain.states import ProcessState
from tests.support.topology import Topology, running_topology
from tests.support.waiting import eventually

pytestmark = [pytest.mark.rabbitmq, pytest.mark.postgres]


@pytest.fixture
async def topo(hub: str, tmp_path: Path) -> AsyncIterator[Topology]:
    async with running_topology(
        hub,
        tmp_path,
        ORDERFLOW_STEP_TIMEOUT_S="30",
        ORDERFLOW_INBOX_CLAIM_TTL_S="30",
        ORDERFLOW_HANDLER_TIMEOUT_S="20",
        ORDERFLOW_AGENT_HTTP_TIMEOUT_S="4",  # the agent gives up on the hung call after this
        ORDERFLOW_BREAKER_FAIL_MAX="100",
    ) as t:
        yield t


async def test_a_hung_call_that_wakes_after_its_undo_makes_no_effect(topo: Topology) -> None:
    await topo.start_all(ORDERFLOW_REMOTE_HANG_RATE="1", ORDERFLOW_REMOTE_HANG_S="12")
    result = topo.cli("submit", "--json", "--count", "1", "--seed", "42")
    assert result.returncode == 0, result.stderr
    [order_id] = json.loads(result.stdout)["order_ids"]

    async def hanging() -> dict[str, Any] | None:
        calls = await topo.remote.attempts(order_id=order_id)
        return calls[0] if calls and calls[0]["outcome"] == "unanswered" else None

    hung = await eventually(hanging, timeout=30, what="the reserve call hanging")
    assert hung["operation"] == "inventory.reserve"
    # Before the agent's HTTP timeout: its next call is refused, and no call hangs any more.
    await topo.remote.set_faults(hang_rate=0, reject_operations=["inventory.reserve"])

    async def compensated() -> bool:
        state = await topo.store.get_state(order_id)
        return state is not None and state.process_state is ProcessState.COMPENSATED

    await eventually(compensated, timeout=30, what="the order compensated")

    async def woke() -> dict[str, Any] | None:
        calls = await topo.remote.attempts(order_id=order_id)
        first = calls[0]
        return first if first["answered_at"] is not None else None

    woken = await eventually(woke, timeout=30, what="the hung call waking and being answered")
    calls = await topo.remote.attempts(order_id=order_id)
    [release] = [c for c in calls if c["operation"] == "inventory.release"]
    # The scenario: the undo was recorded before the hung call woke, by the same attempt.
    assert release["fencing_token"] == hung["fencing_token"]
    assert release["answered_at"] < woken["answered_at"]
    assert (woken["hung"], woken["outcome"]) == (True, "undone")

    effects = [(e["operation"], e["outcome"]) for e in await topo.remote.ledger(order_id=order_id)]
    assert effects == [("inventory.release", "noop")], "no reservation without its release"
    report = await topo.audit()
    assert report["ok"], report["violations"]
