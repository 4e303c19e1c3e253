"""One trace per order across real processes (shared/tracing.py).

A topology runs with `ORDERFLOW_TRACE_FILE` set in every process, so each exports its spans to
one shared JSON-lines file; the processes are stopped (which flushes what they buffered) before
the file is read. An order that completes and one whose payment is declined (compensated) must
each make one trace: the submission's root span with the ids derived from the order, every
other span hanging from a span of the same trace, and the spans of every process the order
crossed in it, nested as the messages went: the scheduler's publish of a step request, the
agent's handling of it, its remote call, its publish of the reply, the scheduler's receipt.
Every log line about an order carries that order's trace id.
"""

from __future__ import annotations

import json
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from shared.domain.states import ProcessState
from shared.remote.payments import DECLINED_TEST_TOKEN
from shared.tracing import order_ids, order_trace_id
from tests.support.topology import Topology, running_topology

pytestmark = [pytest.mark.rabbitmq, pytest.mark.postgres]

Span = dict[str, Any]
AGENTS = ("inventory", "payment", "shipping")


@pytest.fixture
async def topo(tmp_path: Path) -> AsyncIterator[Topology]:
    hub = f"trace_{uuid.uuid4().hex[:8]}"
    async with running_topology(
        hub, tmp_path, ORDERFLOW_TRACE_FILE=str(tmp_path / "spans.jsonl")
    ) as topo:
        yield topo


def spans_of(path: Path) -> list[Span]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def hex_id(value: str | None) -> int | None:
    return None if value is None else int(value, 16)


def service(span: Span) -> str:
    return str(span["resource"]["attributes"]["service.name"])


def by_id(spans: list[Span]) -> dict[int, Span]:
    return {int(s["context"]["span_id"], 16): s for s in spans}


def parent_of(span: Span, spans: dict[int, Span]) -> Span | None:
    parent = hex_id(span["parent_id"])
    return None if parent is None else spans.get(parent)


def check_one_trace(hub: str, order_id: str, every: list[Span]) -> list[Span]:
    """The order's spans, once checked to form one tree rooted at the submission's span."""
    trace_id, root_id = order_ids(hub, order_id)
    mine = [s for s in every if int(s["context"]["trace_id"], 16) == trace_id]
    assert mine, f"no span in the trace of {order_id}"
    # Nothing about the order went into another trace.
    strays = [
        s
        for s in every
        if s["attributes"].get("orderflow.order_id") == order_id
        and int(s["context"]["trace_id"], 16) != trace_id
    ]
    assert not strays, strays
    spans = by_id(mine)
    roots = [s for s in mine if s["parent_id"] is None]
    assert len(roots) == 1, roots
    root = roots[0]
    assert int(root["context"]["span_id"], 16) == root_id
    assert (root["name"], service(root)) == ("record order", "orderflow-submission")
    for span in mine:
        if span is not root:
            assert hex_id(span["parent_id"]) in spans, f"{span['name']} hangs from no span"
    return mine


def render(mine: list[Span]) -> str:
    """The trace as an indented tree: start offset, duration, process, span (for the log)."""
    children: dict[int | None, list[Span]] = {}
    for span in mine:
        children.setdefault(hex_id(span["parent_id"]), []).append(span)
    t0 = min(iso_ns(s["start_time"]) for s in mine)
    out: list[str] = []

    def walk(span: Span, depth: int) -> None:
        start, end = iso_ns(span["start_time"]), iso_ns(span["end_time"])
        out.append(
            f"{(start - t0) / 1e6:8.1f} ms {(end - start) / 1e6:7.1f} ms  "
            f"{service(span):28} {'  ' * depth}{span['name']}"
        )
        for child in sorted(
            children.get(int(span["context"]["span_id"], 16), []),
            key=lambda s: iso_ns(s["start_time"]),
        ):
            walk(child, depth + 1)

    for root in children.get(None, []):
        walk(root, 0)
    return "\n".join(out)


def iso_ns(text: str) -> int:
    """A span's ISO 8601 time (to the microsecond, `Z`) as nanoseconds."""
    return int(datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() * 1e9)


async def test_each_order_is_one_trace_across_every_process(topo: Topology) -> None:
    await topo.start_all()
    ok, declined = "o-trace-ok", "o-trace-declined"
    # This one asks for status messages (its final status among them) and waits for them.
    waited = topo.cli("submit", "--order-id", ok, "--wait", "--timeout", "60")
    assert waited.returncode == 0, waited.stdout + waited.stderr
    assert (
        topo.cli(
            "submit", "--order-id", declined, "--payment-token", DECLINED_TEST_TOKEN
        ).returncode
        == 0
    )
    states = await topo.wait_settled(2)
    settled = {state: n for state, n in states.items() if n}
    assert settled == {ProcessState.PROCESSED: 1, ProcessState.COMPENSATED: 1}, states
    codes = topo.stop_all()  # each process exports what it buffered as it stops
    assert all(code == 0 for code in codes.values()), codes

    every = spans_of(topo.workdir / "spans.jsonl")
    for order_id in (ok, declined):
        mine = check_one_trace(topo.hub, order_id, every)
        spans = by_id(mine)
        services = Counter(service(s) for s in mine)
        assert {"orderflow-submission", "orderflow-scheduler"} <= set(services), services

        # Each step asked of an agent: the agent's handling hangs from the scheduler's publish
        # of the request, the remote call from the handling, the reply's receipt from the
        # agent's publish of the reply.
        handled = [s for s in mine if s["name"] == "handle step.request"]
        assert handled
        for handling in handled:
            request = parent_of(handling, spans)
            assert request is not None
            assert (request["kind"], service(request)) == (
                "SpanKind.PRODUCER",
                "orderflow-scheduler",
            )
            attempt = parent_of(request, spans)
            assert attempt is not None and attempt["name"] in ("attempt", "compensate")
            children = [
                s for s in mine if hex_id(s["parent_id"]) == int(handling["context"]["span_id"], 16)
            ]
            assert any(c["kind"] == "SpanKind.CLIENT" for c in children), children
            assert any(c["kind"] == "SpanKind.PRODUCER" for c in children), children
        received = [s for s in mine if s["name"] == "receive step.reply"]
        assert len(received) == len(handled)
        for receipt in received:
            reply = parent_of(receipt, spans)
            assert reply is not None and service(reply).startswith("orderflow-agent-")
        # The remote calls carried the trace to the remote service.
        calls = [s for s in mine if s["kind"] == "SpanKind.CLIENT"]
        assert len(calls) >= len(handled)

    print(render(check_one_trace(topo.hub, ok, every)))
    ok_agents = {service(s) for s in check_one_trace(topo.hub, ok, every)}
    assert {f"orderflow-agent-{a}" for a in AGENTS} <= ok_agents
    # The final status message went out inside the order's trace.
    assert any(
        s["kind"] == "SpanKind.PRODUCER" and s["name"] == f"publish {topo.hub}.status"
        for s in check_one_trace(topo.hub, ok, every)
    )

    # Every log line about an order names its trace.
    lines = 0
    for label in topo.procs:
        for raw in topo.logs(label).splitlines():
            if not raw.startswith("{"):
                continue
            line = json.loads(raw)
            order_id = line.get("order_id")
            if order_id in (ok, declined):
                lines += 1
                assert line["trace_id"] == order_trace_id(topo.hub, order_id), line
    assert lines > 0
