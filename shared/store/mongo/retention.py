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
        self._resume: dict[str, tuple[datetime, Any] | None] = {}
        """Where each journal purge goes on from (see `_expired_journal`)."""

    async def purge_journal(self, *, finished_before: datetime, limit: int) -> Purged:
        history = await self._expired_journal(self._history, "at", finished_before, limit)
        undos = await self._expired_journal(
            self._compensation, "recorded_at", finished_before, limit
        )
        h = c = 0
        if history:
            h = (await self._history.delete_many({"_id": {"$in": history}})).deleted_count
        if undos:
            c = (await self._compensation.delete_many({"_id": {"$in": undos}})).deleted_count
        return Purged(history=h, compensation=c)

    async def _expired_journal(
        self, collection: Any, at: str, finished_before: datetime, limit: int
    ) -> list[Any]:
        """Ids of at most `limit` journal documents older than `finished_before` whose order
        finished before it, oldest first; those of orders still parked or live are passed over
        (a page at a time, like PostgreSQL's filtered index scan).

        One call looks at `PURGE_PAGES` pages at most, and the next goes on from where it
        stopped, back to the oldest once it reached the cutoff: the journals of parked orders
        are read once a sweep, not once a round. (An order that finishes meanwhile has its
        older entries taken by the next sweep, or with the order by `purge_orders`.)"""
        finished: dict[str, bool] = {}
        found: list[Any] = []
        after = self._resume.get(at)
        for _ in range(PURGE_PAGES):
            query: dict[str, Any] = {at: {"$lt": finished_before}}
            if after is not None:
                query["$or"] = [{at: {"$gt": after[0]}}, {at: after[0], "_id": {"$gt": after[1]}}]
            cursor = collection.find(query, {"order_id": 1, at: 1})
            cursor = cursor.sort([(at, ASCENDING), ("_id", ASCENDING)]).limit(PURGE_PAGE)
            docs = await cursor.to_list(None)
            unknown = sorted({d["order_id"] for d in docs} - finished.keys())
            if unknown:
                done = await self._state.find(
                    {"_id": {"$in": unknown}, **_finished_before(finished_before)}, {"_id": 1}
                ).to_list(None)
                ids = {d["_id"] for d in done}
                finished |= {order_id: order_id in ids for order_id in unknown}
            found += [d["_id"] for d in docs if finished[d["order_id"]]][: limit - len(found)]
            if len(found) >= limit:
                break  # this page again next time: what it found is deleted by then
            if len(docs) < PURGE_PAGE:
                after = None
                break
            after = (docs[-1][at], docs[-1]["_id"])
        self._resume[at] = after
        return found

    async def purge_orders(self, *, finished_before: datetime, limit: int) -> Purged:
        finished = _finished_before(finished_before)
        docs = await self._state.find(finished, {"_id": 1}).limit(limit).to_list(None)
        ids = [d["_id"] for d in docs]
        if not ids:
            return Purged()
        # Without a transaction, the state record goes last: it is what marks an order for
        # this purge, so a crash part-way leaves it to be found and finished by the next batch.
        # A finished order's state never changes again, so what was read still holds.
        h = await self._history.delete_many({"order_id": {"$in": ids}})
        c = await self._compensation.delete_many({"order_id": {"$in": ids}})
        await self._orders.delete_many({"_id": {"$in": ids}})
        s = await self._state.delete_many({"_id": {"$in": ids}, **finished})
        return Purged(s.deleted_count, h.deleted_count, c.deleted_count)

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


def _finished_before(cutoff: datetime) -> dict[str, Any]:
    """State records of orders that finished (Processed, Compensated, Cancelled) before `cutoff`."""
    return {
        "process_state": {"$in": sorted(s.value for s in TERMINAL_STATES)},
        "updated_at": {"$lt": cutoff},
    }
