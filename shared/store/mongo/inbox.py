"""The inbox on MongoDB: MessageId dedupe for the consumers (`Inbox`)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from pymongo.errors import DuplicateKeyError

from shared.domain.coordination import InboxOutcome
from shared.store.mongo.connection import MongoPart
from shared.store.values import InboxClaim, InboxDone


class MongoInbox(MongoPart):
    async def inbox_claim_many(
        self, queue: str, claims: Sequence[InboxClaim], *, now: datetime
    ) -> list[InboxOutcome]:
        # One at a time, in order: each claim's outcome needs its own conditional write.
        return [
            await self.inbox_claim(
                queue, c.message_id, holder=c.holder, now=now, claim_until=c.claim_until
            )
            for c in claims
        ]

    async def inbox_complete_many(self, queue: str, done: Sequence[InboxDone]) -> None:
        for d in done:
            await self.inbox_complete(queue, d.message_id, holder=d.holder, keep_until=d.keep_until)

    async def inbox_release(self, queue: str, message_id: str, *, holder: str) -> bool:
        result = await self._inbox.delete_one(
            {"_id": {"q": queue, "m": message_id}, "holder": holder, "state": "processing"}
        )
        return bool(result.deleted_count == 1)

    # Not on the port (the consumers claim and complete in batches, which come through these
    # one at a time); the contract suite also calls them.
    async def inbox_claim(
        self, queue: str, message_id: str, *, holder: str, now: datetime, claim_until: datetime
    ) -> InboxOutcome:
        key = {"q": queue, "m": message_id}
        claim = {"state": "processing", "holder": holder, "expires_at": claim_until}
        try:
            await self._inbox.insert_one({"_id": key, **claim})
            return InboxOutcome.CLAIMED
        except DuplicateKeyError:
            pass
        # Expired: a dedupe window that passed, or a claim whose holder died.
        taken = await self._inbox.find_one_and_update(
            {
                "_id": key,
                "$or": [
                    {"expires_at": {"$lte": now}},
                    {"holder": holder, "state": "processing"},
                ],
            },
            {"$set": claim},
        )
        if taken is not None:
            return InboxOutcome.CLAIMED
        doc = await self._inbox.find_one({"_id": key})
        if doc is not None and doc["state"] == "done":
            return InboxOutcome.DUPLICATE
        return InboxOutcome.BUSY

    async def inbox_complete(
        self, queue: str, message_id: str, *, holder: str, keep_until: datetime
    ) -> bool:
        # An upsert: the server's TTL monitor (or the purge) may have deleted a claim that
        # expired while its message was handled, and the dedupe record must be written anyway.
        # Held by another since, the entry is theirs: the insert collides on _id.
        try:
            await self._inbox.update_one(
                {"_id": {"q": queue, "m": message_id}, "holder": holder},
                {"$set": {"state": "done", "expires_at": keep_until}},
                upsert=True,
            )
        except DuplicateKeyError:
            return False
        return True
