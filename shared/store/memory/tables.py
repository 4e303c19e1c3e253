"""The memory store's tables: what every part of the reference adapter shares (one store
object per hub, its dictionaries the tables of the real stores)."""

from __future__ import annotations

import asyncio
import functools
import inspect
import itertools
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, ParamSpec, TypeVar

from shared.domain.coordination import ComponentStatus, Lease
from shared.domain.journal import Alert, AlertState, CompensationEntry, HistoryEvent
from shared.domain.models import OrderRecord, StateRecord
from shared.domain.tokens import ApiToken
from shared.store.values import Wakers

T = TypeVar("T")
R = TypeVar("R")
P = ParamSpec("P")

TABLES = (
    "alerts",
    "api_tokens",
    "compensation_log",
    "components",
    "history",
    "inbox",
    "lease",
    "orders",
    "state",
)


@dataclass(frozen=True)
class InboxEntry:
    """One inbox entry: a claim being handled, or a handled id kept for the dedupe window."""

    state: str  # "processing" or "done"
    holder: str
    expires_at: datetime


def oldest(items: Iterable[T], key: Callable[[T], Any], limit: int) -> list[T]:
    return sorted(items, key=key)[:limit]


def yielding(operation: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R]]:
    """`operation`, yielding to the loop once before its body runs, as a round trip would."""

    @functools.wraps(operation)
    async def turn(*args: P.args, **kwargs: P.kwargs) -> R:
        await asyncio.sleep(0)
        return await operation(*args, **kwargs)

    return turn


class MemoryPart:
    """What every part of the memory store shares: its tables, and the loop's turn.

    Every public coroutine method a part defines is wrapped in `yielding` as the class is made,
    so that concurrent callers interleave between operations as they would over a connection,
    while each operation's body, having no await, stays atomic."""

    kind = "memory"

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for name, member in list(vars(cls).items()):
            if not name.startswith("_") and inspect.iscoroutinefunction(member):
                setattr(cls, name, yielding(member))

    def __init__(self) -> None:
        self._arrivals = Wakers()
        self._reset()

    def _reset(self) -> None:
        self._orders: dict[str, OrderRecord] = {}
        self._states: dict[str, StateRecord] = {}
        self._history: dict[int, HistoryEvent] = {}
        """By insertion number: an event's place among those of the same time."""
        self._compensation: dict[tuple[str, str], CompensationEntry] = {}
        self._inbox: dict[tuple[str, str], InboxEntry] = {}
        self._leases: dict[str, Lease] = {}
        self._alerts: dict[str, Alert] = {}
        self._alert_states: dict[str, AlertState] = {}
        """Alerts acknowledged or resolved (kept with their alert, purged with it)."""
        self._components: dict[str, ComponentStatus] = {}
        self._tokens: dict[str, ApiToken] = {}
        """By digest."""
        self._numbers = itertools.count(1)


class MemoryAdmin(MemoryPart):
    """Nothing to create, check or close: each yields to the loop as a round trip would."""

    async def init(self) -> None:
        pass

    async def ping(self) -> None:
        pass

    async def close(self) -> None:
        pass

    async def drop(self) -> None:
        self._reset()
