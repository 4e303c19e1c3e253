"""Structured logs: one JSON object per line, with the pattern's identifiers when known."""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any

# Attributes every LogRecord has; anything else passed through `extra=` is an event field.
_STANDARD = frozenset(vars(logging.makeLogRecord({}))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    def __init__(self, *, process: str, hub: str) -> None:
        super().__init__()
        self._static = {"process": process, "hub": hub}

    def format(self, record: logging.LogRecord) -> str:
        event: dict[str, Any] = {
            "at": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "event": record.getMessage(),
            **self._static,
        }
        event |= {k: v for k, v in vars(record).items() if k not in _STANDARD}
        if record.exc_info:
            event["exception"] = self.formatException(record.exc_info)
        return json.dumps(event, default=str)


def configure_logging(*, level: str, process: str, hub: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter(process=process, hub=hub))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for noisy in ("aio_pika", "aiormq", "pymongo", "asyncio"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))
