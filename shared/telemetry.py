"""Structured logs: one JSON object per line, with the pattern's identifiers when known, and no
card number in clear: every line passes through `redact_shown` (shared/domain/redaction.py),
whoever wrote it and whatever it quotes (a message id, an error, a received value).

On a terminal (`ORDERFLOW_LOG_FORMAT=auto`, the default, or `text`) each event is one line a
person reads instead: its time, process, level when above info, event and fields (`key=value`,
logfmt-like), the same fields as the JSON's but the ones every line of a process repeats."""

from __future__ import annotations

import contextlib
import json
import logging
import sys
from collections.abc import Iterator, Mapping
from contextvars import ContextVar
from datetime import UTC, datetime
from types import MappingProxyType
from typing import IO, Any

from shared.domain.redaction import may_hold_card, redact_shown
from shared.domain.text import printable
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


def _told(record: logging.LogRecord, static: Mapping[str, str]) -> dict[str, Any]:
    """What a log line tells: its event, the process's fields, the work's, the record's own."""
    told: dict[str, Any] = {"event": record.getMessage(), **static, **_FIELDS.get()}
    return told | {k: v for k, v in vars(record).items() if k not in _STANDARD}


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
        told = _told(record, self._static)
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


TEXT_LEFT_OUT = frozenset({"event", "process", "hub", "color_message"})
"""Fields a text line does not repeat as `key=value`: the event and the process lead the line,
the hub is every line's, and uvicorn's `color_message` repeats its event."""


class TextFormatter(logging.Formatter):
    """One line a person reads per event: `12:00:01.234 scheduler-host-42 WARNING event k=v`
    (local time; the level only above info), card numbers masked and unsafe characters
    escaped; a traceback follows on lines of its own, indented."""

    def __init__(self, *, process: str, hub: str) -> None:
        super().__init__()
        self._static = {"process": process, "hub": hub}

    def format(self, record: logging.LogRecord) -> str:
        told = _told(record, self._static)
        at = datetime.fromtimestamp(record.created).strftime("%H:%M:%S.%f")[:-3]
        level = f" {record.levelname}" if record.levelno > logging.INFO else ""
        fields = "".join(
            f" {key}={_logfmt(value)}"
            for key, value in _flat(told)
            if key not in TEXT_LEFT_OUT and value is not None
        )
        line = printable(redact_shown(f"{at} {told['process']}{level} {told['event']}{fields}"))
        if record.exc_info:
            trace = redact_shown(self.formatException(record.exc_info))
            line += "".join(f"\n    {printable(part)}" for part in trace.splitlines())
        return line


def _flat(fields: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    """`fields` with nested mappings' keys dotted: `intake.queue`, `intake.state`."""
    for key, value in fields.items():
        if isinstance(value, Mapping):
            yield from _flat(value, f"{prefix}{key}.")  # an empty one: nothing to tell
        else:
            yield f"{prefix}{key}", value


def _logfmt(value: Any) -> str:
    """A field's value: a list joined by commas, a text with spaces, quotes or `=` quoted."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, Mapping):
        return "(" + " ".join(f"{k}={_logfmt(v)}" for k, v in _flat(value)) + ")"
    if isinstance(value, list | tuple):
        return ",".join(_logfmt(item) for item in value)
    text = str(value)
    if not text or any(c in text for c in ' "='):
        return json.dumps(text, ensure_ascii=False)
    return text


LOG_FORMATS = {"json": JsonFormatter, "text": TextFormatter}


def chosen_format(setting: str, stream: IO[str]) -> str:
    """`json` or `text`: the setting's, or for `auto`, text when `stream` is a terminal."""
    if setting != "auto":
        return setting
    return "text" if stream.isatty() else "json"


def configure_logging(*, level: str, process: str, hub: str, log_format: str = "json") -> None:
    """Log to stderr at `level` in `log_format` (`auto`: text on a terminal, else JSON)."""
    handler = logging.StreamHandler(sys.stderr)
    formatter = LOG_FORMATS[chosen_format(log_format, sys.stderr)]
    handler.setFormatter(formatter(process=process, hub=hub))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for noisy in ("aio_pika", "aiormq", "pymongo", "asyncio"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))
