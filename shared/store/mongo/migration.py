"""`orderflow init` moves a hub's journal into its state records (layout 2,
decision:mongodb-transition-one-write).

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
- **for a stopped release**: the older release's processes append their journal to the old
  collections, after their state write; what they append once init read a record is not moved.
  So they are stopped first (CHANGELOG.md, "Upgrading"), and this release's processes refuse
  to start on a hub that still has the old collections (`check_layout`): on a record not moved they
  would see no undo log, and compensate nothing. A record is still moved only if it is as it
  was read, so that a write of anyone else is never lost; that record goes in the next pass.
"""

from __future__ import annotations

import logging
from typing import Any

from pymongo import ASCENDING, DESCENDING, UpdateOne

from shared.domain.journal import CompensationEntry, HistoryEvent, UndoStatus
from shared.errors import ConfigurationError, ServiceUnavailable
from shared.store.mongo.connection import LAYOUT, OLD_COLLECTIONS, MongoPart, load
from shared.store.mongo.journal import HISTORY_KEPT, events_doc, undo_doc

log = logging.getLogger(__name__)

BATCH = 200
"""State records one migration step reads, and writes in one round trip."""
PASSES = 5
"""Passes over the records left before init gives up (each pass meets only the records a
running process changed during the pass before)."""


_RANK = {UndoStatus.PENDING: 0, UndoStatus.FAILED: 1, UndoStatus.DONE: 2}
"""How far along an undo is (the order `UndoMark`s may take it)."""
_AS_READ = {"history": 1, "history_count": 1, "undo_log": 1}
"""What a record's move reads of it: what this release may have appended."""


class MongoMigration(MongoPart):
    async def check_layout(self) -> None:
        """Refuse a hub whose journal is still in the older release's collections: two reads,
        as the process starts (the API's user may read documents, not list collections)."""
        for name in ("compensation_log", "history"):
            if await self._named(name).find_one({}, {"_id": 1}) is not None:
                raise ConfigurationError(
                    f"the hub's journal is in the layout of an older release (collection "
                    f"{self._prefix}{name}): stop the older release's processes and run this "
                    "release's `orderflow init`, which moves it, before its processes start"
                )

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
        """One pass over every state record, `BATCH` at a time in `_id` order (each page read
        by the `_id` index, whatever has moved already): (moved, not moved)."""
        moved = missed = 0
        after: Any = None
        while True:
            query = {} if after is None else {"_id": {"$gt": after}}
            cursor = self._state.find(query, {"layout": 1})
            page = await cursor.sort("_id", ASCENDING).limit(BATCH).to_list(None)
            if not page:
                return moved, missed
            after = page[-1]["_id"]
            ids = [d["_id"] for d in page if "layout" not in d]
            if not ids:
                continue
            old = {"_id": {"$in": ids}, "layout": {"$exists": False}}
            docs = await self._state.find(old, _AS_READ).to_list(None)
            writes = [await self._move(doc) for doc in docs]
            if writes:
                result = await self._state.bulk_write(writes, ordered=False)
                moved += result.modified_count
                missed += len(writes) - result.modified_count

    async def _move(self, doc: dict[str, Any]) -> UpdateOne:
        """A record's move: its old journal, before what this release appended already; of its
        events, the newest `HISTORY_KEPT` are read (the older release kept them all)."""
        order_id = doc["_id"]
        events = self._named("history")
        old_events = await events.count_documents({"order_id": order_id})
        newest = events.find({"order_id": order_id})
        newest = newest.sort([("at", DESCENDING), ("_id", DESCENDING)]).limit(HISTORY_KEPT)
        history = [load(HistoryEvent, d) for d in reversed(await newest.to_list(None))]
        logged_before = self._named("compensation_log").find({"order_id": order_id})
        undos = [
            load(CompensationEntry, d)
            for d in await logged_before.sort("seq", ASCENDING).to_list(None)
        ]
        appended = doc.get("history", [])
        # A step logged in both (a process of this release started on the hub before init,
        # which it now refuses to): the entry further along, Done being final.
        embedded = {u["step"]: u for u in doc.get("undo_log", [])}
        logged = []
        for undo in undos:
            old, new = undo_doc(undo), embedded.pop(undo.step, None)
            further = new is not None and _RANK[new["status"]] > _RANK[old["status"]]
            logged.append(new if further else old)
        logged += embedded.values()
        as_read = {
            "_id": doc["_id"],
            "layout": {"$exists": False},
            "history_count": doc.get("history_count"),
            "undo_log": doc.get("undo_log", {"$exists": False}),
        }
        moved = {
            "layout": LAYOUT,
            "history": (events_doc(history) + appended)[-HISTORY_KEPT:],
            "history_count": old_events + doc.get("history_count", len(appended)),
            "undo_log": logged,
        }
        return UpdateOne(as_read, {"$set": moved})
