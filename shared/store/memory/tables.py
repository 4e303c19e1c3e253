"""The memory store's tables: what every part of the reference adapter shares (one store
object per hub, its dictionaries the tables of the real stores)."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

from shared.domain.coordination import ComponentStatus, Lease
from shared.domain.journal import Alert, AlertState, CompensationEntry, HistoryEvent
from shared.domain.models import OrderRecord, StateRecord
from shared.domain.tokens import ApiToken
from shared.store.values import Wakers

T = TypeVar("T")

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


class MemoryPart:
    """What every part of the memory store shares: its tables."""

    kind = "memory"

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
        await asyncio.sleep(0)

    async def ping(self) -> None:
        await asyncio.sleep(0)

    async def close(self) -> None:
        await asyncio.sleep(0)

    async def drop(self) -> None:
        await asyncio.sleep(0)
        self._reset()
