"""The journal on MongoDB: history and the compensation log (`Journal`)."""

from __future__ import annotations

from collections.abc import Sequence

from pymongo import ASCENDING, ReturnDocument
from pymongo.errors import DuplicateKeyError

from shared.domain.journal import CompensationEntry, HistoryEvent, UndoStatus
from shared.store.codec import plain
from shared.store.mongo.connection import MongoPart, load
from shared.store.values import UndoMark


class MongoJournal(MongoPart):
    async def append_history(self, event: HistoryEvent) -> None:
        await self._history.insert_one(plain(event.model_copy(update={"seq": None})))

    async def append_history_many(self, events: Sequence[HistoryEvent]) -> None:
        if events:
            await self._history.insert_many(
                [plain(e.model_copy(update={"seq": None})) for e in events], ordered=True
            )

    async def read_history(self, order_id: str) -> list[HistoryEvent]:
        cursor = self._history.find({"order_id": order_id}).sort(
            [("at", ASCENDING), ("_id", ASCENDING)]
        )
        docs = await cursor.to_list(None)
        return [load(HistoryEvent, d, seq=i) for i, d in enumerate(docs, start=1)]

    async def read_compensation(self, order_id: str) -> list[CompensationEntry]:
        cursor = self._compensation.find({"order_id": order_id}).sort("seq", ASCENDING)
        return [load(CompensationEntry, d) for d in await cursor.to_list(None)]

    async def append_compensation(self, entry: CompensationEntry) -> bool:
        """Not on the port: a process records an undo with its state change (`update_state`,
        which calls this after the update); the contract suite sets up log entries with it."""
        key = {"order_id": entry.order_id, "step": entry.step}
        if await self._compensation.find_one(key, {"_id": 1}) is not None:
            return False
        counter = await self._counters.find_one_and_update(
            {"_id": "compensation_log"},
            {"$inc": {"value": 1}},
            upsert=True,
            return_document=ReturnDocument.AFTER,
        )
        doc = plain(entry.model_copy(update={"seq": counter["value"]}))
        doc["_id"] = f"{entry.order_id}|{entry.step}"
        try:
            await self._compensation.insert_one(doc)
        except DuplicateKeyError:
            return False
        return True

    async def _mark_compensation(self, order_id: str, undo: UndoMark) -> None:
        done_at = undo.at if undo.status is UndoStatus.DONE else None
        await self._compensation.update_one(
            {"_id": f"{order_id}|{undo.step}", "status": {"$ne": UndoStatus.DONE.value}},
            {"$set": {"status": undo.status.value, "done_at": done_at, "error": undo.error}},
        )
