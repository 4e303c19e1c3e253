"""`orderflow init` moves a hub's journal into its state records (layout 2, README decision 147).

Before layout 2, an order's history and undo log were documents of their own (the collections
`history` and `compensation_log`, with a shared sequence in `counters`). Init moves them, a
batch of `BATCH` state records at a time, into each record's `history`, `history_count` and
`undo_log`, and marks it `layout: 2`:

- **idempotent**: a record of layout 2 is never moved again, and once no record is left of the
  layout before, the old collections are dropped (an event of an order with no state record
  goes with them);
- **resumable**: each record moves in one conditional write, so an init stopped part-way (a
  crash, an outage) leaves records that moved and records that did not, and the next init goes
  on with the ones that did not;
- **safe beside a running release**: a record is moved only if it is still as it was read (what
  a process appended meanwhile is kept: that record is moved on the next pass).
"""

from __future__ import annotations

import logging
from typing import Any

from pymongo import ASCENDING, UpdateOne

from shared.domain.journal import CompensationEntry, HistoryEvent
from shared.errors import ServiceUnavailable
from shared.store.mongo.connection import LAYOUT, OLD_COLLECTIONS, MongoPart, load
from shared.store.mongo.journal import HISTORY_KEPT, events_doc, undo_doc

log = logging.getLogger(__name__)

BATCH = 200
"""State records one migration step reads, and writes in one round trip."""
PASSES = 5
"""Passes over the records left before init gives up (each pass meets only the records a
running process changed during the pass before)."""


class MongoMigration(MongoPart):
    async def migrate_journal(self) -> int:
        """Move every state record of the layout before to layout 2; how many moved."""
        present = set(await self._db.list_collection_names())
        old = [n for n in sorted(OLD_COLLECTIONS) if f"{self._prefix}{n}" in present]
        if not old:
            return 0
        moved = 0
        for _ in range(PASSES):
            moved_now, left = await self._one_pass()
            moved += moved_now
            if not left:
                break
        else:
            raise ServiceUnavailable(
                f"the journal of {left} order records could not be moved into them in "
                f"{PASSES} passes (processes keep changing them): run `orderflow init` again"
            )
        for name in old:
            await self._named(name).drop()
        if moved:
            log.info("moved the journal of %d order records into them (layout 2)", moved)
        return moved

    async def _one_pass(self) -> tuple[int, int]:
        """One pass over the records of the layout before: (moved, not moved)."""
        moved = missed = 0
        after: Any = None
        while True:
            query: dict[str, Any] = {"layout": {"$exists": False}}
            if after is not None:
                query["_id"] = {"$gt": after}
            cursor = self._state.find(query, {"history": 1, "history_count": 1, "undo_log": 1})
            docs = await cursor.sort("_id", ASCENDING).limit(BATCH).to_list(None)
            if not docs:
                return moved, missed
            writes = await self._moves(docs)
            result = await self._state.bulk_write(writes, ordered=False)
            moved += result.modified_count
            missed += len(writes) - result.modified_count
            after = docs[-1]["_id"]

    async def _moves(self, docs: list[dict[str, Any]]) -> list[UpdateOne]:
        """Each record's move: its old journal, before what this release appended already."""
        ids = [d["_id"] for d in docs]
        history: dict[str, list[HistoryEvent]] = {i: [] for i in ids}
        found = self._named("history").find({"order_id": {"$in": ids}})
        for d in await found.sort([("at", ASCENDING), ("_id", ASCENDING)]).to_list(None):
            history[d["order_id"]].append(load(HistoryEvent, d))
        undos: dict[str, list[CompensationEntry]] = {i: [] for i in ids}
        found = self._named("compensation_log").find({"order_id": {"$in": ids}})
        for d in await found.sort("seq", ASCENDING).to_list(None):
            undos[d["order_id"]].append(load(CompensationEntry, d))
        return [self._move(doc, history[doc["_id"]], undos[doc["_id"]]) for doc in docs]

    @staticmethod
    def _move(
        doc: dict[str, Any], history: list[HistoryEvent], undos: list[CompensationEntry]
    ) -> UpdateOne:
        appended = doc.get("history", [])
        logged = [undo_doc(u) for u in undos]
        steps = {u.step for u in undos}
        logged += [u for u in doc.get("undo_log", []) if u["step"] not in steps]
        as_read = {
            "_id": doc["_id"],
            "layout": {"$exists": False},
            "history_count": doc.get("history_count"),
            "undo_log": doc.get("undo_log", {"$exists": False}),
        }
        moved = {
            "layout": LAYOUT,
            "history": (events_doc(history) + appended)[-HISTORY_KEPT:],
            "history_count": len(history) + doc.get("history_count", len(appended)),
            "undo_log": logged,
        }
        return UpdateOne(as_read, {"$set": moved})
