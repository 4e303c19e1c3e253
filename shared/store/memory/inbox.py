"""The inbox in memory: MessageId dedupe for the consumers (`Inbox`)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from shared.domain.coordination import InboxOutcome
from shared.store.memory.tables import InboxEntry, MemoryPart
from shared.store.values import InboxClaim, InboxDone


class MemoryInbox(MemoryPart):
    def _inbox_claim(
        self, queue: str, message_id: str, holder: str, now: datetime, claim_until: datetime
    ) -> InboxOutcome:
        key = (queue, message_id)
        entry = self._inbox.get(key)
        if (
            entry is None
            or entry.expires_at <= now
            or (entry.holder == holder and entry.state == "processing")
        ):
            self._inbox[key] = InboxEntry("processing", holder, claim_until)
            return InboxOutcome.CLAIMED
        return InboxOutcome.DUPLICATE if entry.state == "done" else InboxOutcome.BUSY

    async def inbox_claim_many(
        self, queue: str, claims: Sequence[InboxClaim], *, now: datetime
    ) -> list[InboxOutcome]:
        return [
            self._inbox_claim(queue, c.message_id, c.holder, now, c.claim_until) for c in claims
        ]

    def _inbox_complete(
        self, queue: str, message_id: str, holder: str, keep_until: datetime
    ) -> bool:
        # Written even where the claim expired and was purged (decision:inbox-completion-upsert); an
        # entry another
        # holder has taken since stays theirs.
        key = (queue, message_id)
        entry = self._inbox.get(key)
        if entry is not None and entry.holder != holder:
            return False
        self._inbox[key] = InboxEntry("done", holder, keep_until)
        return True

    async def inbox_complete_many(self, queue: str, done: Sequence[InboxDone]) -> None:
        for d in done:
            self._inbox_complete(queue, d.message_id, d.holder, d.keep_until)

    async def inbox_release(self, queue: str, message_id: str, *, holder: str) -> bool:
        entry = self._inbox.get((queue, message_id))
        if entry is None or entry.holder != holder or entry.state != "processing":
            return False
        del self._inbox[(queue, message_id)]
        return True

    # Not on the port (the consumers claim and complete in batches); the contract suite's.
    async def inbox_claim(
        self, queue: str, message_id: str, *, holder: str, now: datetime, claim_until: datetime
    ) -> InboxOutcome:
        return self._inbox_claim(queue, message_id, holder, now, claim_until)

    async def inbox_complete(
        self, queue: str, message_id: str, *, holder: str, keep_until: datetime
    ) -> bool:
        return self._inbox_complete(queue, message_id, holder, keep_until)
