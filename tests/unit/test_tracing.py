"""shared/tracing.py: ids derived from the order, which context a span hangs from, sampling
whole orders alike in every process, and the two exporters (a file, and OTLP/HTTP to a real
local HTTP receiver)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from shared.tracing import (
    configure_tracing,
    enabled,
    failed,
    order_ids,
    order_span,
    order_trace_id,
    otlp_traces_url,
    publish_span,
    shutdown_tracing,
)

HUB = "unit"


@pytest.fixture
def spans_file(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "spans.jsonl"
    assert configure_tracing(hub=HUB, service="test", instance="t-1", trace_file=str(path))
    yield path
    shutdown_tracing()


def exported(path: Path) -> list[dict[str, Any]]:
    shutdown_tracing()  # flushes
    return [json.loads(line) for line in path.read_text().splitlines()]


def ids(span: dict[str, Any]) -> tuple[int, int, int | None]:
    parent = span["parent_id"]
    return (
        int(span["context"]["trace_id"], 16),
        int(span["context"]["span_id"], 16),
        None if parent is None else int(parent, 16),
    )


@given(st.text(min_size=1, max_size=40), st.text(min_size=1, max_size=40))
def test_ids_are_derived_from_hub_and_order_and_never_zero(hub: str, order_id: str) -> None:
    trace_id, span_id = order_ids(hub, order_id)
    assert order_ids(hub, order_id) == (trace_id, span_id)
    assert 0 < trace_id < 2**128 and 0 < span_id < 2**64
    assert order_trace_id(hub, order_id) == f"{trace_id:032x}"
    assert order_ids(hub + "x", order_id)[0] != trace_id
    assert order_ids(hub, order_id + "x")[0] != trace_id


def test_off_by_default_nothing_is_made_or_injected() -> None:
    assert not configure_tracing(hub=HUB, service="test", instance="t-1")
    assert not enabled()
    headers: dict[str, Any] = {}
    with order_span("attempt", "o-1") as span, publish_span("x", "k", headers):
        assert span is None
    assert headers == {}


def test_the_root_takes_the_derived_ids_and_the_rest_hang_from_it(spans_file: Path) -> None:
    trace_id, root_id = order_ids(HUB, "o-1")
    with order_span("record order", "o-1", root=True):
        pass
    with order_span("attempt", "o-1"):  # e.g. a scheduler's claim: known from the store only
        headers: dict[str, Any] = {}
        with publish_span("hub.direct", "hub.agent.payment", headers):
            pass
    # The receiver of that message hangs from the publish.
    with order_span("handle step.request", "o-1", headers=headers):
        pass
    spans = {s["name"]: ids(s) for s in exported(spans_file)}
    assert spans["record order"] == (trace_id, root_id, None)
    assert spans["attempt"][0] == trace_id and spans["attempt"][2] == root_id
    publish = spans["publish hub.direct"]
    assert publish[2] == spans["attempt"][1]
    assert headers["traceparent"] == f"00-{trace_id:032x}-{publish[1]:016x}-01"
    assert spans["handle step.request"][2] == publish[1]


def test_a_traceparent_of_another_trace_is_not_followed(spans_file: Path) -> None:
    """A sender's own trace, or a forged one, cannot pull the order's spans out of its trace."""
    trace_id, root_id = order_ids(HUB, "o-2")
    forged = {"traceparent": f"00-{'ab' * 16}-{'cd' * 8}-01"}
    with order_span("handle step.request", "o-2", headers=forged):
        pass
    # A malformed one is no better.
    with order_span("handle step.reply", "o-2", headers={"traceparent": "00-zz"}):
        pass
    for span in exported(spans_file):
        assert ids(span)[0] == trace_id and ids(span)[2] == root_id


def test_an_exception_leaving_the_span_marks_it_failed(spans_file: Path) -> None:
    with pytest.raises(RuntimeError), order_span("attempt", "o-3"):
        raise RuntimeError("remote down")
    (span,) = exported(spans_file)
    assert span["status"]["status_code"] == "ERROR"
    assert "remote down" in span["status"]["description"]


def test_no_exported_span_holds_a_card_number(spans_file: Path) -> None:
    """A span leaves the process like a log line, and is masked like one (issue 33, found by
    review): a message id is the sender's, an exception's message and stack may quote one."""
    card = "4111 1111 1111 1111"
    attributes = {"messaging.message.id": card, "orderflow.deliveries": 1}
    with pytest.raises(RuntimeError), order_span("handle", "o-4", attributes=attributes):
        failed(ValueError(f"unsupported schema_version {card!r}"))
        raise RuntimeError("remote said: card 4111111111111111 declined")
    with order_span("quiet", "o-5", attributes={"messaging.message.id": "m-1"}):
        pass
    spans = exported(spans_file)
    text = json.dumps(spans)
    assert "4111" not in text, text
    masked = next(s for s in spans if s["name"] == "handle")
    assert masked["attributes"]["messaging.message.id"].startswith("[redacted card number #")
    assert "[redacted card number #" in masked["status"]["description"]
    assert masked["events"] and "declined" in json.dumps(masked["events"])
    quiet = next(s for s in spans if s["name"] == "quiet")
    assert quiet["attributes"]["messaging.message.id"] == "m-1"


def test_sampling_keeps_or_drops_whole_orders_alike_in_every_process(tmp_path: Path) -> None:
    """Two "processes" (configured one after the other) with the same ratio trace the same
    orders: the decision is the order's trace id's, not a coin each process tosses."""
    orders = [f"o-{i}" for i in range(200)]
    kept: list[set[str]] = []
    for process in ("submission", "scheduler"):
        path = tmp_path / f"{process}.jsonl"
        configure_tracing(
            hub=HUB, service=process, instance=process, trace_file=str(path), sample_ratio=0.25
        )
        for order_id in orders:
            with order_span("record order", order_id, root=process == "submission"):
                pass
        kept.append({s["attributes"]["orderflow.order_id"] for s in exported(path)})
    assert kept[0] == kept[1]
    assert 20 < len(kept[0]) < 80  # about a quarter of 200


def test_otlp_url() -> None:
    assert otlp_traces_url("http://jaeger:4318") == "http://jaeger:4318/v1/traces"
    assert otlp_traces_url("http://jaeger:4318/") == "http://jaeger:4318/v1/traces"
    assert otlp_traces_url("https://c.example/otlp/v1/traces") == "https://c.example/otlp/v1/traces"


class _Collector(BaseHTTPRequestHandler):
    received: list[tuple[str, bytes]]

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.received.append((self.path, body))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        return None


def test_spans_go_to_an_otlp_http_collector() -> None:
    """The OTLP exporter, set by `ORDERFLOW_OTLP_ENDPOINT`, posts protobuf to `/v1/traces` of a
    real (local) HTTP receiver."""
    received: list[tuple[str, bytes]] = []
    handler = type("Collector", (_Collector,), {"received": received})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        configure_tracing(
            hub=HUB,
            service="scheduler",
            instance="s-1",
            otlp_endpoint=f"http://127.0.0.1:{server.server_address[1]}",
        )
        with order_span("attempt", "o-otlp"):
            pass
        shutdown_tracing()  # flushes, synchronously
    finally:
        server.shutdown()
        thread.join()
    assert received and all(path == "/v1/traces" for path, _ in received)
    request = ExportTraceServiceRequest()
    request.ParseFromString(received[0][1])
    (resource,) = request.resource_spans
    service = {a.key: a.value.string_value for a in resource.resource.attributes}
    assert service["service.name"] == "orderflow-scheduler"
    (span,) = [s for scope in resource.scope_spans for s in scope.spans]
    assert span.name == "attempt"
    assert int.from_bytes(span.trace_id, "big") == order_ids(HUB, "o-otlp")[0]
