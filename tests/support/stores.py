"""A store adapter as the contract suite sets up its cases: the port, and what only tests use.

No process calls these three, so they are not on the port (`shared/store/port.py`); every
adapter keeps them, as methods of its own, for the cases that set up an inbox entry or a
compensation-log entry without going through a consumer or a state change.
"""

from __future__ import annotations

from datetime import datetime
from typing import Protocol

from shared.domain.coordination import InboxOutcome
from shared.domain.journal import CompensationEntry
from shared.store.port import StateStore


class StoreUnderTest(StateStore, Protocol):
    async def inbox_claim(
        self, queue: str, message_id: str, *, holder: str, now: datetime, claim_until: datetime
    ) -> InboxOutcome:
        """One claim of `Inbox.inbox_claim_many`."""

    async def inbox_complete(
        self, queue: str, message_id: str, *, holder: str, keep_until: datetime
    ) -> bool:
        """One entry of `Inbox.inbox_complete_many`; False when another holder has the id."""

    async def append_compensation(self, entry: CompensationEntry) -> bool:
        """Record an undo if not recorded yet, without a state change; True if it was new."""
