"""The retry budget through real processes (issue 14): however often an agent's handling of a
step request is run again, the remote service sees no more calls of the order than its budget,
and `orderflow audit` (violation 6) agrees with the remote service's own count of calls."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from shared.domain.states import ErrorKind, ProcessState
from tests.support.topology import Topology, running_topology
from tests.support.waiting import eventually

pytestmark = [pytest.mark.rabbitmq, pytest.mark.postgres]

BUDGET = 6


@pytest.fixture
async def topo(hub: str, tmp_path: Path) -> AsyncIterator[Topology]:
    async with running_topology(
        hub,
        tmp_path,
        ORDERFLOW_RETRY_BUDGET=str(BUDGET),
        ORDERFLOW_AGENT_ATTEMPTS_PER_REQUEST=str(BUDGET),  # the whole budget on one request
        ORDERFLOW_BREAKER_FAIL_MAX="1000",
        ORDERFLOW_FAILURE_THRESHOLD="10",
    ) as t:
        yield t


def submit_one(topo: Topology) -> str:
    result = topo.cli("submit", "--json", "--count", "1", "--seed", "41")
    assert result.returncode == 0, result.stderr
    [order_id] = json.loads(result.stdout)["order_ids"]
    return str(order_id)


async def settled(topo: Topology, order_id: str, timeout: float = 90) -> ProcessState:
    async def done() -> ProcessState | None:
        state = await topo.store.get_state(order_id)
        terminal = {ProcessState.ERROR, ProcessState.PROCESSED, ProcessState.COMPENSATED}
        return state.process_state if state and state.process_state in terminal else None

    state: ProcessState = await eventually(done, timeout=timeout, interval=0.2, what="settled")
    return state


async def test_handlings_cut_off_and_delivered_twice_spend_one_budget(topo: Topology) -> None:
    """Every call fails transiently and slowly, so one handling of the reserve request makes
    three calls before the consumer's handler timeout cuts it off: an unexpected exception,
    which sets the message aside (and releases its inbox claim) to be handled again later. The
    scheduler also publishes every request twice (the duplicate-delivery fault knob): the
    second copy waits on the first's claim and is handled as soon as it is released. Each
    handling would otherwise have a fresh allowance: four times the budget or more."""
    topo.env |= {
        "ORDERFLOW_STEP_TIMEOUT_S": "20",
        "ORDERFLOW_INBOX_CLAIM_TTL_S": "20",
        "ORDERFLOW_HANDLER_TIMEOUT_S": "1.4",
        "ORDERFLOW_RETRY_DELAY_S": "0.3",
        "ORDERFLOW_FAULT_DUPLICATE_RATE": "1",
    }
    await topo.start_all(
        ORDERFLOW_REMOTE_TRANSIENT_ERROR_RATE="1", ORDERFLOW_REMOTE_LATENCY_MS="450"
    )
    order_id = submit_one(topo)

    assert await settled(topo, order_id) is ProcessState.ERROR
    state = await topo.store.get_state(order_id)
    assert state is not None and state.error is not None
    assert state.error.kind is ErrorKind.BUDGET_EXHAUSTED
    calls = await topo.remote.attempts(order_id=order_id)
    # More than one handling's worth of calls (three at most before the timeout): the
    # request was handled again, and no handling had an allowance of its own.
    assert 3 < len(calls) <= BUDGET, f"{len(calls)} remote calls for a budget of {BUDGET}"
    report = await topo.audit()
    assert report["ok"], report["violations"]
    assert report["attempts"] == len(calls)


async def test_a_request_delivered_again_after_its_agent_died_spends_nothing_more(
    topo: Topology,
) -> None:
    """The agent is killed in the middle of a call; its request is delivered again to the
    agent started in its place, which takes it over once the dead agent's inbox claim has
    expired (the claim outlasts the step timeout) and must spend no attempt more."""
    await topo.start_all(
        ORDERFLOW_REMOTE_TRANSIENT_ERROR_RATE="1", ORDERFLOW_REMOTE_LATENCY_MS="1500"
    )
    order_id = submit_one(topo)

    async def calling() -> bool:
        return bool(await topo.remote.attempts(order_id=order_id))

    await eventually(calling, timeout=30, what="the inventory agent calling the remote service")
    topo.kill("inventory")
    topo.serve("inventory", "agent", "inventory")

    assert await settled(topo, order_id) is ProcessState.ERROR
    calls = await topo.remote.attempts(order_id=order_id)
    assert len(calls) <= BUDGET, f"{len(calls)} remote calls for a budget of {BUDGET}"
    report = await topo.audit()
    assert report["ok"], report["violations"]
