"""Retention on MongoDB: bounded purges of what expired, and the collections' sizes (`Purges`)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pymongo import ASCENDING

from shared.domain.states import TERMINAL_STATES
from shared.store.mongo.connection import COLLECTIONS, MongoPart
from shared.store.values import Purged

PURGE_PAGE = 500
"""Journal documents one retention page looks at."""
PURGE_PAGES = 8
"""Pages one journal purge looks at, at most; the next one goes on from where it stopped."""


class MongoRetention(MongoPart):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._resume: tuple[datetime, Any] | None = None
        """Where the journal purge goes on from (see `purge_journal`)."""

    async def purge_journal(self, *, finished_before: datetime, limit: int) -> Purged:
        """The oldest events and undo entries of finished orders, out of their documents.

        The orders that finished before the cutoff with a journal older than it, a page at a
        time in (updated_at, _id) order; one call looks at `PURGE_PAGES` pages at most, and the
        next goes on from where it stopped, back to the oldest once it reached the cutoff: the
        finished orders whose journal went already are read once a sweep, not once a round."""
        cutoff = finished_before
        journal_due = {
            "$or": [{"history.0.at": {"$lt": cutoff}}, {"undo_log.0.recorded_at": {"$lt": cutoff}}]
        }
        found = Purged()
        after = self._resume
        for _ in range(PURGE_PAGES):
            query: dict[str, Any] = {**_finished_before(cutoff), **journal_due}
            if after is not None:
                query["$and"] = [
                    {
                        "$or": [
                            {"updated_at": {"$gt": after[0]}},
                            {"updated_at": after[0], "_id": {"$gt": after[1]}},
                        ]
                    }
                ]
            cursor = self._state.find(query, _JOURNAL_TIMES)
            cursor = cursor.sort([("updated_at", ASCENDING), ("_id", ASCENDING)])
            docs = await cursor.limit(PURGE_PAGE).to_list(None)
            for doc in docs:
                if max(found.history, found.compensation) >= limit:
                    self._resume = after  # this order again next time
                    return found
                budget = (limit - found.history, limit - found.compensation)
                h, c, whole = await self._trim(doc, cutoff, *budget)
                found = Purged(history=found.history + h, compensation=found.compensation + c)
                if not whole:
                    self._resume = after  # the rest of this order's next time
                    return found
                after = (doc["updated_at"], doc["_id"])
            if len(docs) < PURGE_PAGE:
                after = None
                break
        self._resume = after
        return found

    async def _trim(
        self, doc: dict[str, Any], cutoff: datetime, events: int, undos: int
    ) -> tuple[int, int, bool]:
        """Drop the oldest events (at most `events`) and undo entries (at most `undos`) recorded
        before `cutoff` from one order's document; how many of each went, and whether that was
        all of them. The document must be as it was read (its history count and undo log's
        length), or nothing changes (and the next sweep sees it): a purge never cuts what an
        append just added."""
        history, undo_log = doc.get("history", []), doc.get("undo_log", [])
        old = (_leading(history, "at", cutoff), _leading(undo_log, "recorded_at", cutoff))
        h, c = min(events, old[0]), min(undos, old[1])
        whole = (h, c) == old
        trims: dict[str, Any] = {}
        if h:
            trims["history"] = {"$each": [], "$slice": -(len(history) - h)}
        if c:
            trims["undo_log"] = {"$each": [], "$slice": -(len(undo_log) - c)}
        if not trims:
            return 0, 0, whole
        as_read = {
            "_id": doc["_id"],
            "history_count": doc.get("history_count"),
            "undo_log": {"$size": len(undo_log)} if "undo_log" in doc else {"$exists": False},
        }
        result = await self._state.update_one(as_read, {"$push": trims})
        return (h, c, whole) if result.modified_count == 1 else (0, 0, True)

    async def purge_orders(self, *, finished_before: datetime, limit: int) -> Purged:
        finished = _finished_before(finished_before)
        docs = await self._state.find(finished, _JOURNAL_TIMES).limit(limit).to_list(None)
        ids = [d["_id"] for d in docs]
        if not ids:
            return Purged()
        # Without a transaction, the state record goes last: it is what marks an order for
        # this purge, so a crash part-way leaves it to be found and finished by the next batch.
        # A finished order's state never changes again, so what was read still holds; its
        # journal goes with it (one document).
        await self._orders.delete_many({"_id": {"$in": ids}})
        s = await self._state.delete_many({"_id": {"$in": ids}, **finished})
        h = sum(len(d.get("history", [])) for d in docs)
        c = sum(len(d.get("undo_log", [])) for d in docs)
        return Purged(s.deleted_count, h, c)

    async def purge_alerts(self, *, raised_before: datetime, limit: int) -> int:
        old = {"at": {"$lt": raised_before}}
        cursor = self._alerts.find(old, {"_id": 1}).sort("at", ASCENDING).limit(limit)
        ids = [d["_id"] for d in await cursor.to_list(None)]
        if not ids:
            return 0
        return int((await self._alerts.delete_many({"_id": {"$in": ids}, **old})).deleted_count)

    async def record_counts(self) -> dict[str, int]:
        # From each collection's metadata (the `count` command without a filter): no scan,
        # whatever the collection's size; an estimate, as the port allows.
        return {
            name: int(await self._named(name).estimated_document_count())
            for name in sorted(COLLECTIONS)
        }

    async def inbox_purge(self, *, now: datetime, limit: int) -> int:
        # The TTL index deletes expired entries too (within a minute of their expiry, by the
        # server's clock); this is the bounded, leader-driven purge both stores share.
        expired = {"expires_at": {"$lte": now}}
        cursor = self._inbox.find(expired, {"_id": 1}).sort("expires_at", ASCENDING).limit(limit)
        ids = [d["_id"] for d in await cursor.to_list(None)]
        if not ids:
            return 0
        # The condition again: a claim that took an expired entry over meanwhile is kept.
        result = await self._inbox.delete_many({"_id": {"$in": ids}, **expired})
        return int(result.deleted_count)


_JOURNAL_TIMES = {"updated_at": 1, "history.at": 1, "history_count": 1, "undo_log.recorded_at": 1}
"""What the purges read of a finished order: when its journal's entries were recorded."""


def _leading(entries: list[dict[str, Any]], at: str, cutoff: datetime) -> int:
    """How many of the first entries were recorded before `cutoff` (the oldest come first)."""
    n = 0
    for entry in entries:
        if entry[at] >= cutoff:
            break
        n += 1
    return n


def _finished_before(cutoff: datetime) -> dict[str, Any]:
    """State records of orders that finished (Processed, Compensated, Cancelled) before `cutoff`."""
    return {
        "process_state": {"$in": sorted(s.value for s in TERMINAL_STATES)},
        "updated_at": {"$lt": cutoff},
    }
