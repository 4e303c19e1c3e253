"""Durations as people write and read them: `90s`, `15m`, `2h`, `1d`; `12s ago`, `in 3m`."""

from __future__ import annotations

import re
from datetime import datetime, timedelta

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str) -> timedelta:
    """`90`, `90s`, `15m`, `2h`, `1d`, `250ms`."""
    match = _DURATION.match(text)
    if match is None:
        raise ValueError(f"not a duration: {text!r} (try 90s, 15m, 2h or 1d)")
    return timedelta(seconds=float(match.group(1)) * _UNITS[match.group(2) or "s"])


def human_age(then: datetime | None, now: datetime) -> str:
    """`12s ago`, `in 3m`, `-` for no time."""
    if then is None:
        return "-"
    seconds = (now - then).total_seconds()
    text = human_duration(abs(seconds))
    return f"{text} ago" if seconds >= 0 else f"in {text}"


def human_duration(seconds: float) -> str:
    if seconds < 1:
        return f"{seconds * 1000:.0f}ms"
    if seconds < 60:
        return f"{seconds:.1f}s"
    if seconds < 3600:
        return f"{seconds // 60:.0f}m{seconds % 60:02.0f}s"
    if seconds < 86400:
        return f"{seconds // 3600:.0f}h{seconds % 3600 // 60:02.0f}m"
    return f"{seconds // 86400:.0f}d{seconds % 86400 // 3600:02.0f}h"
