"""Structured logs: one JSON object per line, with the pattern's identifiers when known, and no
card number in clear: every line passes through `redact_shown` (shared/domain/redaction.py),
whoever wrote it and whatever it quotes (a message id, an error, a received value)."""

from __future__ import annotations

import contextlib
import json
import logging
import sys
from collections.abc import Iterator, Mapping
from contextvars import ContextVar
from datetime import UTC, datetime
from types import MappingProxyType
from typing import Any

from shared.domain.redaction import may_hold_card, redact_shown
from shared.tracing import current_ids, order_trace_id

# Attributes every LogRecord has; anything else passed through `extra=` is an event field.
_STANDARD = frozenset(vars(logging.makeLogRecord({}))) | {"message", "asctime"}

# The identifiers of the work in hand (`order_id`, `instance_id`, `step`, `message_id`, ...), set
# where the work starts and carried by every log line written while doing it, including lines
# written by code that knows nothing of the order. asyncio copies the context into each task, so
# one order's fields never leak into another's lines.
_FIELDS: ContextVar[Mapping[str, Any]] = ContextVar(
    "orderflow_log_fields", default=MappingProxyType({})
)


def _merged(fields: Mapping[str, Any]) -> Mapping[str, Any]:
    return {**_FIELDS.get(), **{k: v for k, v in fields.items() if v is not None}}


def bind_log_fields(**fields: Any) -> None:
    """Add fields to every later log line of the current task (and of tasks it starts)."""
    _FIELDS.set(_merged(fields))


@contextlib.contextmanager
def log_fields(**fields: Any) -> Iterator[None]:
    """Add fields to every log line written inside the block."""
    token = _FIELDS.set(_merged(fields))
    try:
        yield
    finally:
        _FIELDS.reset(token)


class JsonFormatter(logging.Formatter):
    def __init__(self, *, process: str, hub: str) -> None:
        super().__init__()
        self._static = {"process": process, "hub": hub}

    def format(self, record: logging.LogRecord) -> str:
        ours = {
            "at": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
        }
        told: dict[str, Any] = {"event": record.getMessage(), **self._static, **_FIELDS.get()}
        told |= {k: v for k, v in vars(record).items() if k not in _STANDARD}
        order_id = told.get("order_id")
        if isinstance(order_id, str) and "trace_id" not in told:
            # The order's trace (shared/tracing.py), whether or not its spans are exported.
            ours["trace_id"] = order_trace_id(self._static["hub"], order_id)
            span = current_ids()
            if span is not None and span[0] == ours["trace_id"]:
                ours["span_id"] = span[1]
        if record.exc_info:
            told["exception"] = self.formatException(record.exc_info)
        line = json.dumps(ours | told, default=str)  # an `extra=` field wins
        # What the line tells, not the trace ids computed here (whose hex digits hold a run of
        # 12 one time in twenty, and are no card number, nor masked: shared/tracing.py).
        if not _may_hold_card(_without(line, ours.get("trace_id"), ours.get("span_id"))):
            return line  # most lines: no 12 digits in a row, nor text beyond ASCII (escaped)
        # As JSON reads it, masked.
        ours = {k: v for k, v in ours.items() if k not in told}
        return json.dumps(ours | redact_shown(json.loads(json.dumps(told, default=str))))


def _without(line: str, *ids: str | None) -> str:
    for found in ids:
        line = line.replace(found, "") if found else line
    return line


def _may_hold_card(line: str) -> bool:
    """Whether a line of JSON may hold a card number: digits, or text beyond ASCII, which
    JSON escapes (`\\u0664` is a digit too)."""
    return "\\u" in line or may_hold_card(line)


def configure_logging(*, level: str, process: str, hub: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter(process=process, hub=hub))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for noisy in ("aio_pika", "aiormq", "pymongo", "asyncio"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))
