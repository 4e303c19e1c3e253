"""Order and state records on MongoDB: insert, read, conditional update, claim (`OrderStates`).

Single-document updates are atomic in MongoDB, so every conditional update is one
`find_one_and_update` whose filter is the condition. The order and its state record are two
insert-if-absent writes that share no transaction (DESIGN §4). A conditional update whose
outcome is unknown (an outage after the write was sent) reads the record again before it says
anything.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from pymongo import ASCENDING, ReturnDocument
from pymongo.errors import DuplicateKeyError

from shared.domain.identity import instance_id
from shared.domain.journal import CompensationEntry, HistoryEvent
from shared.domain.models import OrderRecord, StateRecord
from shared.domain.updates import ANY, Changes, Expect
from shared.store.codec import plain
from shared.store.mongo.connection import load, load_state, state_doc
from shared.store.mongo.errors import is_outage
from shared.store.mongo.journal import MongoJournal
from shared.store.values import InsertOutcome, UndoMark

_CLAIM_SPREAD = 4
"""A claimer looks at this many times its batch and picks at random, so that concurrent
claimers mostly try different records instead of all racing for the same first few."""


class MongoStates(MongoJournal):
    """The state writes carry their journal entries (`update_state`), hence the journal part."""

    async def insert_order(self, order: OrderRecord, state: StateRecord) -> InsertOutcome:
        doc = plain(order)
        doc["_id"] = order.order_id
        outcome = InsertOutcome.CREATED
        try:
            await self._orders.insert_one(doc)
        except DuplicateKeyError:
            existing = await self._orders.find_one({"_id": order.order_id}, {"fingerprint": 1})
            if existing is None or existing["fingerprint"] != order.fingerprint:
                return InsertOutcome.CONFLICT
            outcome = InsertOutcome.EXISTS
        # A crash between the two writes leaves an order without its state record; the
        # redelivered message comes through here and completes the pair.
        with contextlib.suppress(DuplicateKeyError):
            await self._state.insert_one(state_doc(state))
        return outcome

    async def get_order(self, order_id: str) -> OrderRecord | None:
        doc = await self._orders.find_one({"_id": order_id})
        return None if doc is None else load(OrderRecord, doc)

    async def get_orders(self, order_ids: Sequence[str]) -> list[OrderRecord | None]:
        found = {
            doc["_id"]: load(OrderRecord, doc)
            async for doc in self._orders.find({"_id": {"$in": list(set(order_ids))}})
        }
        return [found.get(order_id) for order_id in order_ids]

    async def get_state(self, order_id: str) -> StateRecord | None:
        doc = await self._state.find_one({"_id": order_id})
        return None if doc is None else load_state(doc)

    async def update_state(
        self,
        order_id: str,
        expect: Expect,
        changes: Changes,
        *,
        history: Sequence[HistoryEvent] = (),
        compensation: CompensationEntry | None = None,
        undo: UndoMark | None = None,
    ) -> StateRecord | None:
        sets = {name: plain(value) for name, value in changes.fields.items()}
        sets |= {f"steps.{name}": plain(step) for name, step in changes.steps.items()}
        try:
            doc = await self._state.find_one_and_update(
                {"_id": order_id, **conditions(expect)},
                {"$set": sets},
                return_document=ReturnDocument.AFTER,
            )
        except Exception as exc:
            if not is_outage(exc):
                raise
            # The outcome is unknown (a write concern not met, a connection lost after the
            # write was sent): the record says whether it applied. Not applied, the error
            # stands and the caller writes again; never a superseded attempt for this.
            doc = await self._settled(lambda: self._state.find_one({"_id": order_id, **sets}))
            if doc is None:
                raise
        if doc is None:
            return None
        # Without a multi-document transaction these follow the update (as separate writes
        # would): the update is the fact, they describe it.
        if compensation is not None:
            await self.append_compensation(compensation)
        if undo is not None:
            # After the state write, never before: a crash between them leaves a step marked
            # Compensated whose log entry is not Done yet, so the undo is asked again under its
            # idempotency key, which the remote service answers without a second effect.
            await self._mark_compensation(order_id, undo)
        await self.append_history_many(history)
        return load_state(doc)

    async def claim(
        self,
        *,
        now: datetime,
        limit: int,
        owner: str,
        complete_by: datetime,
        compensating: bool = False,
    ) -> list[StateRecord]:
        source, target = (
            ("Compensating", "Compensating") if compensating else ("Pending", "Processing")
        )
        due = {"process_state": source, "locked_by": None, "next_attempt_at": {"$lte": now}}
        cursor = self._state.find(due, {"attempt": 1}).sort("next_attempt_at", ASCENDING)
        candidates = await cursor.limit(limit * _CLAIM_SPREAD).to_list(None)
        picked = random.sample(candidates, min(limit, len(candidates)))

        async def take(candidate: dict[str, Any]) -> StateRecord | None:
            attempt = candidate["attempt"] + 1
            doc = await self._state.find_one_and_update(
                {"_id": candidate["_id"], "attempt": candidate["attempt"], **due},
                {
                    "$set": {
                        "process_state": target,
                        "attempt": attempt,
                        "locked_by": instance_id(candidate["_id"], attempt),
                        "owner": owner,
                        "complete_by": complete_by,
                        "updated_at": now,
                    }
                },
                return_document=ReturnDocument.AFTER,
            )
            return None if doc is None else load_state(doc)

        async def settle(candidate: dict[str, Any]) -> StateRecord | None:
            # A take that failed may have applied: what the record holds says so. If it cannot
            # be read, it is given back, not left locked for the supervisor to recover.
            mine = {
                "_id": candidate["_id"],
                "locked_by": instance_id(candidate["_id"], candidate["attempt"] + 1),
                "owner": owner,
            }
            try:
                doc = await self._settled(lambda: self._state.find_one(mine))
            except Exception:
                with contextlib.suppress(Exception):
                    await self._state.update_one(
                        mine, {"$set": {"process_state": source, "locked_by": None}}
                    )
                return None
            return None if doc is None else load_state(doc)

        outcomes = await asyncio.gather(*(take(c) for c in picked), return_exceptions=True)
        for outcome in outcomes:
            if isinstance(outcome, BaseException) and not isinstance(outcome, Exception):
                raise outcome  # cancelled
        claimed = [r for r in outcomes if isinstance(r, StateRecord)]
        failed = [(c, r) for c, r in zip(picked, outcomes, strict=True) if isinstance(r, Exception)]
        if failed:
            settled = await asyncio.gather(*(settle(c) for c, _ in failed))
            claimed += [r for r in settled if r is not None]
            if not claimed:
                raise failed[0][1]
        return claimed


def conditions(expect: Expect) -> dict[str, Any]:
    query: dict[str, Any] = {}
    if expect.process_state is not ANY:
        query["process_state"] = {"$in": [s.value for s in expect.process_state]}
    if expect.locked_by is not ANY:
        query["locked_by"] = expect.locked_by
    if expect.complete_by is not ANY:
        query["complete_by"] = expect.complete_by
    if expect.updated_at is not ANY:
        query["updated_at"] = expect.updated_at
    return query
