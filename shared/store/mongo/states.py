"""Order and state records on MongoDB: insert, read, conditional update, claim (`OrderStates`).

Single-document updates are atomic in MongoDB, and the state record holds its order's journal
(shared/store/mongo/journal.py), so every transition, with the history and undo-log entries it
carries, is one `find_one_and_update` whose filter is the transition's `Expect`
(decision:mongodb-transition-one-write). The order and its state record are two insert-if-absent
writes that share no transaction
(DESIGN §4). A conditional update whose outcome is unknown (an outage after the write was sent)
reads the record again, with a majority's read concern, before it says anything: what a
majority has, a failover cannot take back.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from pymongo import ASCENDING, ReturnDocument
from pymongo.errors import DuplicateKeyError
from pymongo.read_concern import ReadConcern

from shared.domain.claims import Claim, claim_for
from shared.domain.journal import CompensationEntry, HistoryEvent
from shared.domain.models import OrderRecord, StateRecord
from shared.domain.updates import ANY, Changes, Expect
from shared.store.codec import plain
from shared.store.mongo.connection import RECORD, load, load_state, state_doc
from shared.store.mongo.errors import is_outage
from shared.store.mongo.journal import (
    MongoJournal,
    events_doc,
    history_push,
    undo_absent,
    undo_doc,
    undo_pending,
    undo_set,
)
from shared.store.port import ArrivalWatch
from shared.store.values import NEVER, InsertOutcome, UndoMark

_CLAIM_SPREAD = 4
"""A claimer looks at this many times its batch and picks at random, so that concurrent
claimers mostly try different records instead of all racing for the same first few."""


class MongoStates(MongoJournal):
    """The state writes carry their journal entries (`update_state`), hence the journal part."""

    async def insert_order(
        self, order: OrderRecord, state: StateRecord, *, history: Sequence[HistoryEvent] = ()
    ) -> InsertOutcome:
        doc = plain(order)
        doc["_id"] = order.order_id
        outcome = InsertOutcome.CREATED
        try:
            await self._orders.insert_one(doc)
        except DuplicateKeyError:
            # The primary holds the order; a majority read may not see it yet (a copy of the
            # message inserting it right now, its write not yet acknowledged by a majority), and
            # would call it a conflict. So the primary's own view: should that write be rolled
            # back, its copy was not acknowledged and comes again.
            primary = self._orders.with_options(read_concern=ReadConcern("local"))
            existing = await primary.find_one({"_id": order.order_id}, {"fingerprint": 1})
            if existing is None or existing["fingerprint"] != order.fingerprint:
                return InsertOutcome.CONFLICT
            outcome = InsertOutcome.EXISTS
        # A crash between the two writes leaves an order without its state record; the
        # redelivered message comes through here and completes the pair, its first events with
        # it (they are the state record's: they come once, with it).
        with contextlib.suppress(DuplicateKeyError):
            await self._state.insert_one(state_doc(state, events_doc(history)))
        return outcome

    async def watch_arrivals(self, wake: Callable[[], None]) -> ArrivalWatch:
        """No watch here: a change stream needs a replica set and a cursor per scheduler, and
        the scheduler's poll finds every record (decision:new-order-claimed-on-arrival)."""
        return NEVER

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
        doc = await self._state.find_one({"_id": order_id}, RECORD)
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
        if compensation is not None and undo is not None:
            raise ValueError("a transition logs an undo or marks one, never both")
        fields = sets(changes)
        record = {"_id": order_id, **conditions(expect)}
        transition: dict[str, Any] = {"$set": fields, **(history_push(history) if history else {})}
        journal: dict[str, Any] = {}  # what the undo log must be for `logged` to apply
        logged = transition
        if compensation is not None:
            # Insert-if-absent: logged by the step's first start, never again.
            journal = undo_absent(compensation.step)
            push = {**transition.get("$push", {}), "undo_log": undo_doc(compensation)}
            logged = {**transition, "$push": push}
        elif undo is not None:
            # Set unless Done: the filter finds the entry, `$` is the one it found.
            journal = undo_pending(undo.step)
            logged = {**transition, "$set": fields | undo_set(undo)}
        doc = await self._apply(record | journal, logged, fields)
        if doc is None and journal:
            # Nothing matched: the record moved on, or its undo log has the entry already (an
            # earlier start of the step logged it; the undo is Done). The transition again,
            # without what the log has: still one write, the second only in those cases.
            doc = await self._apply(record, transition, fields)
        return None if doc is None else load_state(doc)

    async def _apply(
        self, record: dict[str, Any], update: dict[str, Any], fields: dict[str, Any]
    ) -> dict[str, Any] | None:
        """One conditional write; the record after it, or None if nothing matched."""
        try:
            doc: dict[str, Any] | None = await self._state.find_one_and_update(
                record, update, projection=RECORD, return_document=ReturnDocument.AFTER
            )
        except Exception as exc:
            if not is_outage(exc):
                raise
            # The outcome is unknown (a write concern not met, a connection lost after the
            # write was sent): the record, as a majority has it, says whether it applied, and
            # with it everything the write carried (one document). Not found there (not
            # applied, or not replicated yet), the error stands: an outage, and the caller
            # writes again; never a superseded attempt for this.
            mine = {"_id": record["_id"], **fields}
            doc = await self._settled(lambda: self._state.find_one(mine, RECORD))
            if doc is None:
                raise
        return doc

    async def claim(
        self,
        *,
        now: datetime,
        limit: int,
        owner: str,
        complete_by: datetime,
        compensating: bool = False,
        started_by: str | None = None,
    ) -> list[StateRecord]:
        spec = claim_for(
            now=now, limit=limit, owner=owner, complete_by=complete_by, compensating=compensating
        )
        due = conditions(spec.expect)
        cursor = self._state.find(due, {"attempt": 1}).sort("next_attempt_at", ASCENDING)
        candidates = await cursor.limit(spec.limit * _CLAIM_SPREAD).to_list(None)
        picked = random.sample(candidates, min(spec.limit, len(candidates)))
        takes = (self._take(spec, c, started_by) for c in picked)
        outcomes = await asyncio.gather(*takes, return_exceptions=True)
        for outcome in outcomes:
            if isinstance(outcome, BaseException) and not isinstance(outcome, Exception):
                raise outcome  # cancelled
        claimed = [r for r in outcomes if isinstance(r, StateRecord)]
        failed = [(c, r) for c, r in zip(picked, outcomes, strict=True) if isinstance(r, Exception)]
        if failed:
            settled = await asyncio.gather(*(self._settle(spec, c) for c, _ in failed))
            claimed += [r for r in settled if r is not None]
            if not claimed:
                raise failed[0][1]
        return claimed

    async def _take(
        self, spec: Claim, candidate: dict[str, Any], started_by: str | None
    ) -> StateRecord | None:
        """One record of the claim, if it is still as the claim found it (the same attempt),
        with its `ExecutionStarted` event when asked."""
        order_id, attempt = candidate["_id"], candidate["attempt"]
        changes = spec.changes(order_id, attempt)
        update: dict[str, Any] = {"$set": sets(changes)}
        if started_by is not None:
            update |= history_push([spec.started(order_id, attempt, by=started_by)])
        doc = await self._state.find_one_and_update(
            {"_id": order_id, "attempt": attempt, **conditions(spec.expect)},
            update,
            projection=RECORD,
            return_document=ReturnDocument.AFTER,
        )
        return None if doc is None else load_state(doc)

    async def _settle(self, spec: Claim, candidate: dict[str, Any]) -> StateRecord | None:
        """A take that failed may have applied: what the record holds says so. If it cannot be
        read, it is given back, not left locked for the supervisor to recover."""
        lock = spec.changes(candidate["_id"], candidate["attempt"]).fields["locked_by"]
        mine = {"_id": candidate["_id"], "locked_by": lock, "owner": spec.owner}
        try:
            doc = await self._settled(lambda: self._state.find_one(mine, RECORD))
        except Exception:
            with contextlib.suppress(Exception):
                await self._state.update_one(
                    mine, {"$set": {"process_state": spec.source.value, "locked_by": None}}
                )
            return None
        return None if doc is None else load_state(doc)


def sets(changes: Changes) -> dict[str, Any]:
    """What `changes` sets, as a `$set`: whole fields, and whole steps by their path."""
    fields = {name: plain(value) for name, value in changes.fields.items()}
    return fields | {f"steps.{name}": plain(step) for name, step in changes.steps.items()}


def conditions(expect: Expect) -> dict[str, Any]:
    """An `Expect` as a query filter."""
    query: dict[str, Any] = {}
    if expect.process_state is not ANY:
        names = sorted(s.value for s in expect.process_state)
        # One state as an equality, as the partial indexes of the claims name theirs.
        query["process_state"] = names[0] if len(names) == 1 else {"$in": names}
    if expect.locked_by is not ANY:
        query["locked_by"] = expect.locked_by
    if expect.complete_by is not ANY:
        query["complete_by"] = expect.complete_by
    if expect.updated_at is not ANY:
        query["updated_at"] = expect.updated_at
    if expect.due_by is not ANY:
        query["next_attempt_at"] = {"$lte": expect.due_by}
    return query
