"""Logs a person reads: one text line per event on a terminal, JSON elsewhere
(shared/telemetry.py)."""

from __future__ import annotations

import json
import logging
import os
import re
import sys

import pytest

from shared.config import load_settings
from shared.telemetry import (
    JsonFormatter,
    TextFormatter,
    chosen_format,
    configure_logging,
    log_fields,
)

CARD = "4111111111111111"


def record(event: str, level: int = logging.INFO, **extra: object) -> logging.LogRecord:
    made = logging.makeLogRecord({"msg": event, "levelno": level, "name": "orderflow.test"})
    made.levelname = logging.getLevelName(level)
    made.__dict__.update(extra)
    return made


def text(made: logging.LogRecord) -> str:
    return TextFormatter(process="scheduler-1", hub="shop").format(made)


def test_a_text_line_is_time_process_event_and_its_fields() -> None:
    with log_fields(order_id="o-1", step="payment"):
        line = text(record("step done", attempt=2, paused=False, ids=["a", "b"], gone=None))
    assert re.fullmatch(
        r"\d\d:\d\d:\d\d\.\d{3} scheduler-1 step done order_id=o-1 step=payment attempt=2 "
        r"paused=false ids=a,b",
        line,
    ), line
    assert "hub" not in line and "{" not in line  # every line's hub, and no Python repr


def test_a_nested_field_is_dotted_and_a_level_above_info_is_named() -> None:
    intake = {"queue": "shop.orders", "state": "not-started", "ready": 0, "none": {}}
    line = text(record("a consumer is not taking messages", logging.WARNING, intake=intake))
    assert line.endswith(
        " scheduler-1 WARNING a consumer is not taking messages intake.queue=shop.orders "
        "intake.state=not-started intake.ready=0"
    ), line


def test_a_text_line_masks_card_numbers_and_cannot_be_split_or_drive_the_terminal() -> None:
    line = text(record(f"declined {CARD}", error=f"card {CARD}\nfake: line \x1b[2J"))
    assert CARD not in line
    assert "\n" not in line and "\x1b" not in line
    assert 'error="card ' in line  # a value with spaces is quoted


def test_a_traceback_follows_on_indented_lines() -> None:
    try:
        raise ValueError(f"bad {CARD}")
    except ValueError:
        made = record("round failed", logging.ERROR)
        made.exc_info = sys.exc_info()
    first, *rest = text(made).split("\n")
    assert first.endswith("scheduler-1 ERROR round failed")
    assert rest and all(line.startswith("    ") for line in rest)
    assert "ValueError" in rest[-1] and CARD not in rest[-1]


def test_auto_is_text_on_a_terminal_and_json_on_a_pipe() -> None:
    main, other = os.openpty()
    read, write = os.pipe()
    with os.fdopen(other, "w") as terminal, os.fdopen(write, "w") as pipe:
        assert chosen_format("auto", terminal) == "text"
        assert chosen_format("auto", pipe) == "json"
        assert chosen_format("json", terminal) == "json"
        assert chosen_format("text", pipe) == "text"
    os.close(main)
    os.close(read)


@pytest.mark.parametrize(
    ("setting", "formatter"), [("text", TextFormatter), ("json", JsonFormatter)]
)
def test_configure_logging_uses_the_chosen_format(setting: str, formatter: type) -> None:
    root = logging.getLogger()
    saved, level = root.handlers[:], root.level
    try:
        configure_logging(level="INFO", process="p", hub="h", log_format=setting)
        assert isinstance(root.handlers[0].formatter, formatter)
    finally:
        root.handlers[:] = saved
        root.setLevel(level)


def test_json_lines_are_unchanged_by_the_text_form() -> None:
    line = JsonFormatter(process="p", hub="h").format(record("ready", queue="q"))
    assert json.loads(line)["event"] == "ready" and json.loads(line)["queue"] == "q"


def test_the_setting_takes_auto_text_or_json_only(monkeypatch: pytest.MonkeyPatch) -> None:
    assert load_settings().observability.log_format == "auto"
    monkeypatch.setenv("ORDERFLOW_LOG_FORMAT", "text")
    assert load_settings().observability.log_format == "text"
    monkeypatch.setenv("ORDERFLOW_LOG_FORMAT", "pretty")
    with pytest.raises(Exception, match="ORDERFLOW_LOG_FORMAT"):
        load_settings()
