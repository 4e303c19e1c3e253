"""One trace per order, across every process it crosses (OpenTelemetry).

An order's trace id is not chosen by whoever sees the order first and then handed along: it is
derived from the hub and the order id (`order_trace_id`), so every process that handles the
order, whether it learnt of it from a message (an agent, a reply), from the store (a scheduler's
claim, the supervisor's recovery) or from an operator's command, puts its spans into the same
trace without reading anything back. The trace's root span has an id derived the same way; the
submission process makes it when it records the order (`order_span(..., root=True)`), and every
span with nothing better to hang from hangs from it.

Where a message carries W3C trace context (`traceparent`, written by `inject` into every
message published inside an order's span), its receiver's span is the child of the sender's
publish span, so a step's request, the agent's remote call and the reply nest under the attempt
that asked. A `traceparent` of another trace (a sender's own, or a forged one) is not followed:
the span hangs from the order's root instead. Since the trace id is a hash, ratio sampling
(`ORDERFLOW_TRACE_SAMPLE_RATIO`) keeps or drops whole orders, the same ones in every process,
with no coordination.

Off unless `ORDERFLOW_OTLP_ENDPOINT` (an OTLP/HTTP collector: Jaeger, Tempo, the OpenTelemetry
Collector) or `ORDERFLOW_TRACE_FILE` (spans as JSON lines appended to a file) is set; off, a span
costs one flag check. The trace id is in every log line about an order either way
(shared/telemetry.py), so logs and traces join up even where no span was exported.
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import json
import logging
import os
import threading
from collections.abc import Iterator, Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.sdk.trace.sampling import Decision, ParentBased, TraceIdRatioBased
from opentelemetry.trace import (
    NonRecordingSpan,
    Span,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
)
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from shared.domain.redaction import redact_shown
from shared.domain.text import shown_cut

log = logging.getLogger(__name__)

TRACER_NAME = "orderflow"
_PROPAGATOR = TraceContextTextMapPropagator()


@dataclass
class _State:
    enabled: bool = False
    hub: str = ""
    provider: TracerProvider | None = None
    sampler: TraceIdRatioBased | None = None


_STATE = _State()

_FORCED: contextvars.ContextVar[tuple[int, int] | None] = contextvars.ContextVar(
    "orderflow_forced_span_ids", default=None
)
"""The (trace id, span id) the next root span takes: an order's root span."""


def enabled() -> bool:
    return _STATE.enabled


def order_ids(hub: str, order_id: str) -> tuple[int, int]:
    """The order's (trace id, root span id): 128 and 64 bits of one BLAKE2b digest of the hub
    and the order id, never zero (which W3C trace context reserves for "invalid")."""
    digest = hashlib.blake2b(f"{hub}\0{order_id}".encode(), digest_size=24).digest()
    trace_id = int.from_bytes(digest[:16], "big") or 1
    span_id = int.from_bytes(digest[16:], "big") or 1
    return trace_id, span_id


def order_trace_id(hub: str, order_id: str) -> str:
    """The order's trace id as the 32 hex digits a trace backend shows and searches by."""
    return f"{order_ids(hub, order_id)[0]:032x}"


class _OrderIds(RandomIdGenerator):
    """Random ids, except for an order's root span, which takes the ids derived from the order
    (set in `_FORCED` around that one span's creation)."""

    def generate_span_id(self) -> int:
        forced = _FORCED.get()
        return forced[1] if forced is not None else super().generate_span_id()

    def generate_trace_id(self) -> int:
        forced = _FORCED.get()
        return forced[0] if forced is not None else super().generate_trace_id()


class FileSpanExporter(SpanExporter):
    """Spans as JSON lines appended to one file, which several processes may share (each line
    is one `write` to a file opened for appending). For tests, and for a look at a few orders
    without a tracing backend."""

    def __init__(self, path: str) -> None:
        self._path = path
        self._lock = threading.Lock()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        lines = "".join(json.dumps(json.loads(s.to_json(indent=None))) + "\n" for s in spans)
        try:
            with self._lock:
                fd = os.open(self._path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
                try:
                    os.write(fd, lines.encode())
                finally:
                    os.close(fd)
        except OSError:
            log.warning("could not write spans", extra={"path": self._path}, exc_info=True)
            return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        return None


class MaskedSpanExporter(SpanExporter):
    """Another exporter's spans with every card number masked (`redact_shown`, as in every
    other text that leaves a process: shared/domain/redaction.py): in attributes (a message id
    is the sender's), events (a recorded exception's message and stack) and the status'
    description. Spans with nothing to mask go as they are."""

    def __init__(self, inner: SpanExporter) -> None:
        self._inner = inner

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return self._inner.export([masked_span(s) for s in spans])

    def shutdown(self) -> None:
        self._inner.shutdown()

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return self._inner.force_flush(timeout_millis)


def masked_span(span: ReadableSpan) -> ReadableSpan:
    """`span` with every card number in its attributes, events and status masked (the very
    same span when there is none)."""
    attributes = dict(span.attributes or {})
    shown = redact_shown(attributes)
    changed = shown is not attributes
    events = []
    for event in span.events:
        told = dict(event.attributes or {})
        masked = redact_shown(told)
        changed = changed or masked is not told
        events.append(event if masked is told else Event(event.name, masked, event.timestamp))
    status = span.status
    if status.description and redact_shown(status.description) != status.description:
        status, changed = Status(status.status_code, redact_shown(status.description)), True
    if not changed:
        return span
    return ReadableSpan(
        name=span.name,
        context=span.context,
        parent=span.parent,
        resource=span.resource,
        attributes=shown,
        events=events,
        links=span.links,
        kind=span.kind,
        status=status,
        start_time=span.start_time,
        end_time=span.end_time,
        instrumentation_scope=span.instrumentation_scope,
    )


def otlp_traces_url(endpoint: str) -> str:
    """The collector's traces URL: `http://host:4318` gains the standard `/v1/traces`; a URL
    with a path of its own is taken as it is."""
    parts = urlsplit(endpoint)
    if parts.path in ("", "/"):
        return endpoint.rstrip("/") + "/v1/traces"
    return endpoint


def configure_tracing(
    *,
    hub: str,
    service: str,
    instance: str,
    otlp_endpoint: str = "",
    trace_file: str = "",
    sample_ratio: float = 1.0,
) -> bool:
    """Set this process up to export spans; False (and nothing set up) when neither an OTLP
    endpoint nor a file is given. Once per process: the tracer provider is global."""
    if _STATE.provider is not None:
        shutdown_tracing()
    _STATE.hub = hub
    if not otlp_endpoint and not trace_file:
        return False
    sampler = TraceIdRatioBased(sample_ratio)
    provider = TracerProvider(
        resource=Resource.create(
            {
                "service.name": f"orderflow-{service}",
                "service.instance.id": instance,
                "orderflow.hub": hub,
            }
        ),
        id_generator=_OrderIds(),
        sampler=ParentBased(sampler),
    )
    if otlp_endpoint:
        # Imported here: only a process that exports over OTLP pays for protobuf's import.
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import (  # noqa: PLC0415
            OTLPSpanExporter,
        )

        otlp = OTLPSpanExporter(endpoint=otlp_traces_url(otlp_endpoint))
        provider.add_span_processor(BatchSpanProcessor(MaskedSpanExporter(otlp)))
    if trace_file:
        provider.add_span_processor(
            BatchSpanProcessor(
                MaskedSpanExporter(FileSpanExporter(trace_file)), schedule_delay_millis=500
            )
        )
    trace.set_tracer_provider(provider)
    _STATE.provider = provider
    _STATE.sampler = sampler
    _STATE.enabled = True
    return True


def shutdown_tracing() -> None:
    """Export what is buffered and stop (at process exit)."""
    provider = _STATE.provider
    if provider is not None:
        provider.shutdown()
    _STATE.enabled = False
    _STATE.provider = None


def _tracer() -> trace.Tracer:
    provider = _STATE.provider
    assert provider is not None
    return provider.get_tracer(TRACER_NAME)


def _parent(order_id: str, headers: Mapping[str, Any] | None) -> Context:
    """The context an order's span hangs from: the sender's span when the message carries one of
    this order's trace, else the order's root span."""
    trace_id, root_id = order_ids(_STATE.hub, order_id)
    if headers:
        carrier = {k: v for k, v in headers.items() if k == "traceparent" and isinstance(v, str)}
        if carrier:
            extracted = _PROPAGATOR.extract(carrier)
            sent = trace.get_current_span(extracted).get_span_context()
            if sent.is_valid and sent.trace_id == trace_id:
                return extracted
    assert _STATE.sampler is not None
    decision = _STATE.sampler.should_sample(None, trace_id, "order").decision
    sampled = decision is Decision.RECORD_AND_SAMPLE
    root = SpanContext(
        trace_id=trace_id,
        span_id=root_id,
        is_remote=True,
        trace_flags=TraceFlags(TraceFlags.SAMPLED if sampled else TraceFlags.DEFAULT),
    )
    return trace.set_span_in_context(NonRecordingSpan(root))


@contextlib.contextmanager
def order_span(
    name: str,
    order_id: str,
    *,
    headers: Mapping[str, Any] | None = None,
    kind: SpanKind = SpanKind.INTERNAL,
    root: bool = False,
    attributes: Mapping[str, str | int | float | bool] | None = None,
) -> Iterator[Span | None]:
    """A span of the order's trace around the block, current inside it (so what the block
    publishes carries it); None, and nothing done, when tracing is off. `root`: the order's
    root span itself (the submission's, when it records the order). An exception leaving the
    block marks the span failed and propagates."""
    if not _STATE.enabled:
        yield None
        return
    attrs: dict[str, str | int | float | bool] = {"orderflow.order_id": order_id}
    attrs.update(attributes or {})
    tracer = _tracer()
    if root:
        token = _FORCED.set(order_ids(_STATE.hub, order_id))
        try:
            span = tracer.start_span(name, context=Context(), kind=kind, attributes=attrs)
        finally:
            _FORCED.reset(token)
    else:
        span = tracer.start_span(
            name, context=_parent(order_id, headers), kind=kind, attributes=attrs
        )
    with trace.use_span(
        span, end_on_exit=True, record_exception=True, set_status_on_exception=True
    ):
        yield span


@contextlib.contextmanager
def publish_span(
    exchange: str, routing_key: str, headers: MutableMapping[str, Any]
) -> Iterator[None]:
    """Inside an order's span: a producer span around a publish (its confirm included), whose
    context goes into the message's `headers`. Outside one (or with tracing off) nothing: a
    heartbeat or an alert is no order's."""
    if not _STATE.enabled or not trace.get_current_span().get_span_context().is_valid:
        yield
        return
    name = f"publish {exchange or routing_key}"
    with _tracer().start_as_current_span(
        name,
        kind=SpanKind.PRODUCER,
        attributes={
            "messaging.system": "rabbitmq",
            "messaging.destination.name": exchange or routing_key,
            "messaging.rabbitmq.destination.routing_key": routing_key,
        },
    ):
        _PROPAGATOR.inject(headers)
        yield


def failed(error: BaseException | str) -> None:
    """Mark the current span failed (a handler's error that does not leave the span's block)."""
    span = trace.get_current_span()
    if not span.is_recording():
        return
    if isinstance(error, BaseException):
        span.record_exception(error)
        span.set_status(
            Status(StatusCode.ERROR, shown_cut(f"{type(error).__name__}: {error}", 500))
        )
    else:
        span.set_status(Status(StatusCode.ERROR, shown_cut(error, 500)))


def current_ids() -> tuple[str, str] | None:
    """The current span's (trace id, span id) in hex, when one is recording."""
    context = trace.get_current_span().get_span_context()
    if not _STATE.enabled or not context.is_valid:
        return None
    return f"{context.trace_id:032x}", f"{context.span_id:016x}"


def aiohttp_trace_configs() -> list[Any]:
    """The maintained aiohttp client instrumentation, as trace configs for a `ClientSession`:
    a client span per remote call, its context sent in the request's `traceparent`. Empty
    when tracing is off."""
    if not _STATE.enabled:
        return []
    from opentelemetry.instrumentation.aiohttp_client import (  # noqa: PLC0415
        create_trace_config,
    )

    return [create_trace_config(tracer_provider=_STATE.provider)]
