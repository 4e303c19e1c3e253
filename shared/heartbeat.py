"""Heartbeats: every serving process reports its status to the store every `heartbeat_s`.

A status expires after three missed beats, so a process that died stops being listed on its
own; a clean stop removes it at once. After each beat the process runs its periodic checks
(an agent's open circuits, a scheduler's watch for a missing supervisor leader): the heartbeat
is their clock, and a check that fails is logged and does not stop the beat.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime, timedelta
from types import TracebackType
from typing import Any

from shared.domain.coordination import ComponentStatus
from shared.domain.timing import utcnow
from shared.errors import ServiceUnavailable
from shared.store.port import ComponentStatuses

log = logging.getLogger(__name__)

StatusData = Callable[[], dict[str, Any]]
"""The kind-specific part of a status, read at each beat."""
Check = Callable[[], Awaitable[None]]

MISSED_BEATS = 3
"""A status expires after this many beats without a report."""


def status_of(
    name: str,
    kind: str,
    *,
    now: datetime,
    every: timedelta,
    metrics_port: int,
    data: dict[str, Any],
) -> ComponentStatus:
    return ComponentStatus(
        name=name,
        kind=kind,
        at=now,
        expires_at=now + MISSED_BEATS * every,
        data={**data, "metrics_port": metrics_port or None, "pid": os.getpid()},
    )


class Heartbeat:
    """Runs in the background of a process for as long as its `async with` block."""

    def __init__(
        self,
        store: ComponentStatuses,
        *,
        name: str,
        kind: str,
        every_s: float,
        metrics_port: int,
        data: StatusData,
        checks: Sequence[Check] = (),
        prepare: Check | None = None,
    ) -> None:
        self._store = store
        self.name = name
        self.kind = kind
        self._every = timedelta(seconds=every_s)
        self._metrics_port = metrics_port
        self._data = data
        self._checks = list(checks)
        self._prepare = prepare
        """Run before each status is built (what it reads must be fresh)."""
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Heartbeat:
        self._task = asyncio.create_task(self._run(), name=f"heartbeat:{self.name}")
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        try:
            await self._store.forget_status(self.name)
        except Exception as error:  # the status expires on its own
            log.warning("could not remove this process's status", extra={"error": str(error)})

    async def beat(self) -> None:
        """Report the status once, then run the checks."""
        if self._prepare is not None:
            try:
                await self._prepare()
            except Exception:
                log.exception("could not gather this process's status")
        status = status_of(
            self.name,
            self.kind,
            now=utcnow(),
            every=self._every,
            metrics_port=self._metrics_port,
            data=self._data(),
        )
        try:
            await self._store.report_status(status)
        except ServiceUnavailable as error:
            log.warning("could not report this process's status", extra={"error": str(error)})
        except Exception:
            log.exception("could not report this process's status")
        for check in self._checks:
            try:
                await check()
            except ServiceUnavailable as error:
                log.warning("a periodic check could not run", extra={"error": str(error)})
            except Exception:
                log.exception("a periodic check failed")

    async def _run(self) -> None:
        while True:
            await self.beat()
            await asyncio.sleep(self._every.total_seconds())
