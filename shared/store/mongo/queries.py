"""Finding and counting state records on MongoDB (`StateQueries`)."""

from __future__ import annotations

from collections import Counter
from datetime import datetime
from typing import Any

from pymongo import ASCENDING, DESCENDING

from shared.domain.models import StateRecord
from shared.domain.states import ProcessState
from shared.store.mongo.connection import RECORD, MongoPart, load_state
from shared.store.values import ListCursor, ScanCursor, ScanPage, StateQuery, WorkflowUse, page_of

USAGE_PAGE = 10_000
"""State records one command of `workflow_usage` reads (through the `_id` index)."""


class MongoQueries(MongoPart):
    async def scan_expired(
        self,
        *,
        now: datetime,
        states: frozenset[ProcessState],
        limit: int,
        after: ScanCursor | None = None,
        not_before: datetime | None = None,
    ) -> ScanPage:
        window: dict[str, Any] = {"$lte": now}
        if not_before is not None:
            window["$gte"] = not_before
        query: dict[str, Any] = {
            "process_state": {"$in": [s.value for s in states]},
            "complete_by": window,
        }
        if after is not None:
            query["$or"] = [
                {"complete_by": {"$gt": after.complete_by}},
                {"complete_by": after.complete_by, "_id": {"$gt": after.order_id}},
            ]
        cursor = self._state.find(query, RECORD)
        cursor = cursor.sort([("complete_by", ASCENDING), ("_id", ASCENDING)])
        docs = await cursor.limit(limit).to_list(None)
        return page_of([load_state(d) for d in docs], limit)

    async def count_by_state(self) -> dict[ProcessState, int]:
        counts = {}
        for state in ProcessState:
            counts[state] = await self._state.count_documents({"process_state": state.value})
        return counts

    async def count_in_states(self, states: frozenset[ProcessState]) -> int:
        query = {"process_state": {"$in": [s.value for s in states]}}
        return int(await self._state.count_documents(query))

    async def workflow_usage(self) -> list[WorkflowUse]:
        # Every record counts (finished ones too, until retention takes them) and no index
        # holds (workflow, version, state): the records are read in pages of `_id`, each page
        # grouped on the server, so that no one command reads the whole collection under the
        # command timeout, and what comes back is a few counts a page.
        counts: Counter[tuple[str, int, str]] = Counter()
        after = ""  # every order id is greater
        while True:
            pipeline: list[dict[str, Any]] = [
                {"$match": {"_id": {"$gt": after}}},
                {"$sort": {"_id": ASCENDING}},
                {"$limit": USAGE_PAGE},
                {
                    "$group": {
                        "_id": {"w": "$workflow", "v": "$workflow_version", "s": "$process_state"},
                        "n": {"$sum": 1},
                        "last": {"$max": "$_id"},
                    }
                },
            ]
            groups = await (await self._state.aggregate(pipeline)).to_list(None)
            for d in groups:
                counts[(d["_id"]["w"], d["_id"]["v"], d["_id"]["s"])] += d["n"]
            if sum(d["n"] for d in groups) < USAGE_PAGE:
                break
            after = max(d["last"] for d in groups)
        return [WorkflowUse(w, v, ProcessState(s), n) for (w, v, s), n in sorted(counts.items())]

    async def find_stuck_pending(self, *, due_before: datetime, limit: int) -> list[StateRecord]:
        query = {
            "process_state": "Pending",
            "locked_by": None,
            "next_attempt_at": {"$lt": due_before},
        }
        cursor = self._state.find(query, RECORD).sort("next_attempt_at", ASCENDING).limit(limit)
        return [load_state(d) for d in await cursor.to_list(None)]

    async def list_states(self, *, after: str | None, limit: int) -> list[StateRecord]:
        query = {} if after is None else {"_id": {"$gt": after}}
        cursor = self._state.find(query, RECORD).sort("_id", ASCENDING).limit(limit)
        return [load_state(d) for d in await cursor.to_list(None)]

    async def query_states(
        self, query: StateQuery, *, limit: int, after: ListCursor | None = None
    ) -> list[StateRecord]:
        conditions: list[dict[str, Any]] = []
        if query.states is not None:
            conditions.append({"process_state": {"$in": sorted(s.value for s in query.states)}})
        if query.changed_before is not None:
            conditions.append({"updated_at": {"$lt": query.changed_before}})
        if query.error_kind is not None:
            conditions.append({"error.kind": query.error_kind.value})
        if after is not None:
            conditions.append(
                {
                    "$or": [
                        {"updated_at": {"$lt": after.updated_at}},
                        {"updated_at": after.updated_at, "_id": {"$lt": after.order_id}},
                    ]
                }
            )
        filter_: dict[str, Any] = {"$and": conditions} if conditions else {}
        cursor = (
            self._state.find(filter_, RECORD)
            .sort([("updated_at", DESCENDING), ("_id", DESCENDING)])
            .limit(limit)
        )
        return [load_state(d) for d in await cursor.to_list(None)]

    async def list_order_ids(self, *, after: str | None, limit: int) -> list[str]:
        query = {} if after is None else {"_id": {"$gt": after}}
        cursor = self._orders.find(query, {"_id": 1}).sort("_id", ASCENDING).limit(limit)
        return [str(d["_id"]) for d in await cursor.to_list(None)]
