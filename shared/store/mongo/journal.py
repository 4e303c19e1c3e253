"""The journal on MongoDB: an order's history and undo log live in its state record.

What one transition changes is one document (decision:mongodb-transition-one-write): the state
record holds
`history` (the newest `HISTORY_KEPT` events, with `history_count`, how many were ever appended)
and `undo_log` (the compensation log, in the order its steps started), so a state change and the
journal entries that describe it are one conditional write, as PostgreSQL's one statement is.
No counter document: an entry's place in its list is its order.

Past the bound the oldest events go, each append dropping as many as it adds beyond it; the
events kept keep their numbers (`seq` counts from the first event ever appended), so a reader
sees where the timeline was cut. An order with a step retried hundreds of times keeps its last
`HISTORY_KEPT` events, and its document stays far below MongoDB's 16 MiB.

An event of an order without a state record has no document to go to and is not kept (a late
event of an order retention deleted: its timeline went with it).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pymongo import UpdateOne

from shared.domain.journal import CompensationEntry, HistoryEvent, UndoStatus
from shared.store.codec import plain
from shared.store.mongo.connection import MongoPart, load
from shared.store.values import UndoMark

HISTORY_KEPT = 200
"""Events an order's document keeps: its newest."""


def events_doc(events: Sequence[HistoryEvent]) -> list[dict[str, Any]]:
    """Events as they are kept in their order's document (the order id is the document's)."""
    docs = []
    for event in events:
        doc = plain(event)
        del doc["order_id"], doc["seq"]
        docs.append(doc)
    return docs


def history_push(events: Sequence[HistoryEvent]) -> dict[str, Any]:
    """The update that appends `events` to an order's document, within the bound."""
    return {
        "$push": {"history": {"$each": events_doc(events), "$slice": -HISTORY_KEPT}},
        "$inc": {"history_count": len(events)},
    }


def undo_doc(entry: CompensationEntry) -> dict[str, Any]:
    doc: dict[str, Any] = plain(entry)
    del doc["order_id"], doc["seq"]
    return doc


def undo_set(undo: UndoMark) -> dict[str, Any]:
    """The `$set` of an undo's outcome on the entry the filter `undo_pending` matched."""
    done_at = undo.at if undo.status is UndoStatus.DONE else None
    return {
        "undo_log.$.status": undo.status.value,
        "undo_log.$.done_at": done_at,
        "undo_log.$.error": undo.error,
    }


def undo_pending(step: str) -> dict[str, Any]:
    """The filter of a document whose undo of `step` is logged and not Done (Done is final)."""
    return {"undo_log": {"$elemMatch": {"step": step, "status": {"$ne": UndoStatus.DONE.value}}}}


def undo_absent(step: str) -> dict[str, Any]:
    """The filter of a document that has no undo of `step` logged yet (insert-if-absent)."""
    return {"undo_log.step": {"$ne": step}}


class MongoJournal(MongoPart):
    async def append_history(self, event: HistoryEvent) -> None:
        await self.append_history_many([event])

    async def append_history_many(self, events: Sequence[HistoryEvent]) -> None:
        """One write per order, all in one round trip."""
        orders: dict[str, list[HistoryEvent]] = {}
        for event in events:
            orders.setdefault(event.order_id, []).append(event)
        if len(orders) == 1:
            [(order_id, appended)] = orders.items()
            await self._state.update_one({"_id": order_id}, history_push(appended))
        elif orders:
            writes = [UpdateOne({"_id": k}, history_push(e)) for k, e in orders.items()]
            await self._state.bulk_write(writes, ordered=False)

    async def read_history(self, order_id: str) -> list[HistoryEvent]:
        doc = await self._state.find_one({"_id": order_id}, {"history": 1, "history_count": 1})
        if doc is None:
            return []
        kept = doc.get("history", [])
        first = doc.get("history_count", len(kept)) - len(kept) + 1
        return [load(HistoryEvent, d, order_id=order_id, seq=first + i) for i, d in enumerate(kept)]

    async def read_compensation(self, order_id: str) -> list[CompensationEntry]:
        doc = await self._state.find_one({"_id": order_id}, {"undo_log": 1})
        entries = [] if doc is None else doc.get("undo_log", [])
        return [
            load(CompensationEntry, d, order_id=order_id, seq=i)
            for i, d in enumerate(entries, start=1)
        ]

    async def append_compensation(self, entry: CompensationEntry) -> bool:
        """Not on the port: a process records an undo with its state change (`update_state`);
        the contract suite sets up log entries with it. False when the step's undo is logged
        already, or the order has no state record."""
        result = await self._state.update_one(
            {"_id": entry.order_id, **undo_absent(entry.step)},
            {"$push": {"undo_log": undo_doc(entry)}},
        )
        return bool(result.modified_count == 1)
