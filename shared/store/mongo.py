"""The MongoDB adapter of the state store, through PyMongo's async API.

A hub's collections live in the URL's database (the one its user may write), or, where the URL
names none, in a database of the hub's name (`hub_location`). Single-document updates are atomic
in MongoDB, so every conditional update is one `find_one_and_update` whose filter is the
condition. The order and its state record are two insert-if-absent writes that share no
transaction (DESIGN §4).

The server's "try later" answers (a lost connection, a primary stepping down, a timeout, a write
concern not met) are `StoreUnavailable`. Some of them come after the write applied: a
conditional update whose outcome is unknown reads the record again before it says anything.
Reads go to the primary and writes must be acknowledged, whatever the URL asks.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import warnings
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime
from typing import Any, TypeVar

from bson.errors import InvalidDocument, InvalidStringData
from pymongo import ASCENDING, DESCENDING, AsyncMongoClient, ReadPreference, ReturnDocument
from pymongo.errors import (
    BulkWriteError,
    ConnectionFailure,
    DocumentTooLarge,
    DuplicateKeyError,
    ExecutionTimeout,
    OperationFailure,
    PyMongoError,
    WriteConcernError,
)
from pymongo.errors import ConfigurationError as PyMongoConfigurationError
from tenacity import (
    AsyncRetrying,
    retry_if_exception,
    stop_after_delay,
    wait_exponential_jitter,
)

from shared.domain.coordination import ComponentStatus, InboxOutcome, Lease
from shared.domain.identity import instance_id
from shared.domain.journal import Alert, CompensationEntry, HistoryEvent, UndoStatus
from shared.domain.models import STORED, OrderRecord, StateRecord
from shared.domain.states import TERMINAL_STATES, ProcessState
from shared.domain.updates import ANY, Changes, Expect
from shared.errors import ConfigurationError, ServiceUnavailable, one_line
from shared.store.codec import plain, state_from
from shared.store.port import (
    InboxClaim,
    InboxDone,
    InsertOutcome,
    ListCursor,
    Purged,
    ScanCursor,
    ScanPage,
    StateQuery,
    UndoMark,
    WorkflowUse,
    page_of,
)
from shared.store.unavailable import translate_errors
from shared.store.urls import redact

_CLAIM_SPREAD = 4
"""A claimer looks at this many times its batch and picks at random, so that concurrent
claimers mostly try different records instead of all racing for the same first few."""
PURGE_PAGE = 500
"""Journal documents one retention page looks at."""
PURGE_PAGES = 8
"""Pages one journal purge looks at, at most; the next one goes on from where it stopped."""
COLLECTIONS = frozenset(
    {
        "orders",
        "state",
        "history",
        "compensation_log",
        "counters",
        "inbox",
        "lease",
        "alerts",
        "components",
    }
)
"""Every collection of a hub's database."""


def _state_doc(state: StateRecord) -> dict[str, Any]:
    doc: dict[str, Any] = plain(state)
    doc["_id"] = state.order_id
    return doc


def _load_state(doc: dict[str, Any]) -> StateRecord:
    doc.pop("_id", None)
    return state_from(plain(doc))


def _load(model: Any, doc: dict[str, Any], **extra: Any) -> Any:
    doc.pop("_id", None)
    return model.model_validate(plain({**doc, **extra}), strict=False, context=STORED)


REFUSED_CODES = frozenset({2, 9, 14, 52, 55, 56, 57, 10334, 17280})
"""Server errors that refuse a document for what it holds: BadValue, FailedToParse,
TypeMismatch, DollarPrefixedFieldName, InvalidDBRef, EmptyFieldName, DottedFieldName,
BSONObjectTooLarge, KeyTooLong."""


RETRYABLE_CODES = frozenset(
    {6, 7, 24, 50, 64, 89, 91, 112, 134, 189, 262, 9001, 10058, 10107, 11600, 11602, 13435, 13436}
)
"""Server codes that mean "try later": the retryable-writes specification's (HostUnreachable,
HostNotFound, NetworkTimeout, ShutdownInProgress, PrimarySteppedDown, ExceededTimeLimit,
SocketException, NotWritablePrimary and its kin, InterruptedAtShutdown,
InterruptedDueToReplStateChange), and LockTimeout, MaxTimeMSExpired, WriteConcernFailed,
WriteConflict, ReadConcernMajorityNotAvailableYet."""
TRANSIENT_LABELS = ("RetryableWriteError", "TransientTransactionError", "RetryableError")
AUTH_CODES = frozenset({13, 18})
"""Unauthorized, AuthenticationFailed: a user, password or role to fix, not an outage."""
INDEX_CONFLICT_CODES = frozenset({85, 86})
"""IndexOptionsConflict, IndexKeySpecsConflict: an index of this name or keys exists as an
older release (or a hand) made it."""
SYSTEM_DATABASES = frozenset({"admin", "local", "config"})

T = TypeVar("T")


def is_outage(exc: BaseException) -> bool:
    """Whether a driver error means the server cannot do it now (retry later), rather than
    that it refuses it."""
    if isinstance(exc, ConnectionFailure | ExecutionTimeout | WriteConcernError):
        return True  # NotPrimaryError, NetworkTimeout, ServerSelectionTimeoutError; WTimeoutError
    if isinstance(exc, BulkWriteError):
        details = exc.details or {}
        errors = details.get("writeErrors") or []
        concern = bool(details.get("writeConcernErrors"))
        return (concern or bool(errors)) and all(e.get("code") in RETRYABLE_CODES for e in errors)
    if isinstance(exc, OperationFailure):
        return exc.code in RETRYABLE_CODES or any(map(exc.has_error_label, TRANSIENT_LABELS))
    return isinstance(exc, PyMongoError) and exc.timeout


def _refuses(exc: BaseException) -> bool:
    if isinstance(exc, BulkWriteError):  # insert_many: every write error a refusal
        errors = (exc.details or {}).get("writeErrors") or []
        return bool(errors) and all(e.get("code") in REFUSED_CODES for e in errors)
    return isinstance(exc, OperationFailure) and exc.code in REFUSED_CODES


@translate_errors(
    "MongoDB",
    unavailable=(ConnectionFailure,),
    outage=is_outage,
    refused=(
        InvalidDocument,
        InvalidStringData,
        DocumentTooLarge,
        OverflowError,
        UnicodeEncodeError,
    ),
    refusal=_refuses,
)
class MongoStore:
    """State store on MongoDB. `db` is an `AsyncDatabase` (or the test stand-in's facade)."""

    kind = "mongodb"

    def __init__(
        self, db: Any, client: Any = None, *, prefix: str = "", recheck_s: float = 10.0
    ) -> None:
        self._db = db
        self._client = client
        self._prefix = prefix
        self._recheck_s = recheck_s
        self._orders = self._named("orders")
        self._state = self._named("state")
        self._history = self._named("history")
        self._compensation = self._named("compensation_log")
        self._counters = self._named("counters")
        self._inbox = self._named("inbox")
        self._lease = self._named("lease")
        self._alerts = self._named("alerts")
        self._components = self._named("components")
        self._resume: dict[str, tuple[datetime, Any] | None] = {}
        """Where each journal purge goes on from (see `_expired_journal`)."""

    def _named(self, name: str) -> Any:
        """The hub's collection of that name (under the hub's prefix: `hub_location`)."""
        return self._db[f"{self._prefix}{name}"]

    @classmethod
    async def connect(
        cls, url: str, hub: str, *, pool_size: int, timeout: float, command_timeout: float
    ) -> MongoStore:
        client = await client_for(
            url, pool_size=pool_size, timeout=timeout, command_timeout=command_timeout
        )
        return await cls.open(client, hub, url=url, recheck_s=command_timeout)

    @classmethod
    async def open(
        cls, client: Any, hub: str, *, url: str = "", recheck_s: float = 10.0
    ) -> MongoStore:
        """The hub's store over a client (PyMongo's, or the test stand-in's); checks that the
        server answers and lets the user in, and closes the client if not."""
        where = f"MongoDB at {redact(url)}" if url else "MongoDB"
        try:
            db, prefix = database_for(client, hub)
            store = cls(db, client, prefix=prefix, recheck_s=recheck_s)
            await store.ping()
            await store._check_access()
        except ConfigurationError as exc:
            await client.close()
            raise ConfigurationError(f"{where}: {exc}") from exc
        except ServiceUnavailable as exc:
            await client.close()
            raise ServiceUnavailable(f"{where} is unreachable: {exc}") from exc
        except BaseException:
            await client.close()
            raise
        return store

    async def _check_access(self) -> None:
        """One read of the hub's database: a user without a role on it is told so now, not by
        every write later."""
        try:
            await self._lease.find_one({"_id": ""}, {"_id": 1})
        except OperationFailure as exc:
            if exc.code not in AUTH_CODES:
                raise
            raise ConfigurationError(
                f"the user may not read database {self._db.name}: {one_line(exc)} (the "
                "processes need readWrite on it, as infra/mongodb/init-orderflow.js grants)"
            ) from exc

    async def init(self) -> None:
        try:
            await self._create_indexes()
        except OperationFailure as exc:
            if exc.code in INDEX_CONFLICT_CODES:
                raise ConfigurationError(
                    f"an index of database {self._db.name} exists with other options or keys "
                    "than this release creates; an index's options cannot change: drop that "
                    "index (db.<collection>.dropIndex(<name>)), then run `orderflow init` again "
                    f"[{one_line(exc)}]"
                ) from exc
            if exc.code in AUTH_CODES:
                raise ConfigurationError(
                    f"the user may not create indexes in database {self._db.name}: {one_line(exc)}"
                ) from exc
            raise

    async def _create_indexes(self) -> None:
        s = self._state
        await s.create_index(
            [("next_attempt_at", ASCENDING)],
            name="state_claimable",
            partialFilterExpression={"process_state": "Pending", "locked_by": None},
        )
        await s.create_index(
            [("next_attempt_at", ASCENDING)],
            name="state_compensation_claimable",
            partialFilterExpression={"process_state": "Compensating", "locked_by": None},
        )
        await s.create_index(
            [("process_state", ASCENDING), ("complete_by", ASCENDING), ("_id", ASCENDING)],
            name="state_deadlines",
        )
        await s.create_index(
            [("process_state", ASCENDING), ("updated_at", DESCENDING)], name="state_by_state"
        )
        await self._history.create_index(
            [("order_id", ASCENDING), ("at", ASCENDING), ("_id", ASCENDING)],
            name="history_by_order",
        )
        await self._compensation.create_index(
            [("order_id", ASCENDING), ("seq", ASCENDING)], name="compensation_by_order"
        )
        # Retention: the journal expires by its own time, oldest first (see `purge_journal`).
        await self._history.create_index(
            [("at", ASCENDING), ("_id", ASCENDING)], name="history_by_time"
        )
        await self._compensation.create_index(
            [("recorded_at", ASCENDING), ("_id", ASCENDING)], name="compensation_by_time"
        )
        # MongoDB deletes expired inbox entries itself; `inbox_purge` does it at once.
        await self._inbox.create_index("expires_at", name="inbox_expiry", expireAfterSeconds=0)
        await self._alerts.create_index([("at", DESCENDING)], name="alerts_by_time")
        await self._components.create_index(
            "expires_at", name="components_expiry", expireAfterSeconds=3600
        )

    async def ping(self) -> None:
        try:
            await self._db.command("ping")
        except OperationFailure as exc:
            if exc.code not in AUTH_CODES:
                raise ServiceUnavailable(f"MongoDB does not answer: {one_line(exc)}") from exc
            # A wrong password or authSource: no retry will let it in.
            refused = f"the server refused the credentials: {one_line(exc)}"
            raise ConfigurationError(refused) from exc
        except PyMongoError as exc:
            # PyMongo appends its whole topology description; the first sentence says it all.
            reason = one_line(exc).split(" (configured timeouts")[0]
            raise ServiceUnavailable(f"MongoDB does not answer: {reason}") from exc

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()

    async def drop(self) -> None:
        # Collection by collection: the application's user may drop collections of its
        # database (readWrite) but not the database itself.
        for name in sorted(COLLECTIONS):
            await self._named(name).drop()

    async def _settled(self, read: Callable[[], Awaitable[T]]) -> T:
        """A read of what an interrupted write left, retried through an outage (a failover
        takes seconds) for up to the command timeout."""
        async for attempt in AsyncRetrying(
            retry=retry_if_exception(is_outage),
            stop=stop_after_delay(self._recheck_s),
            wait=wait_exponential_jitter(multiplier=0.05, max=1.0, jitter=0.05),
            reraise=True,
        ):
            with attempt:
                return await read()
        raise AssertionError("unreachable: tenacity reraises")

    # -- orders and state records
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
            await self._state.insert_one(_state_doc(state))
        return outcome

    async def get_order(self, order_id: str) -> OrderRecord | None:
        doc = await self._orders.find_one({"_id": order_id})
        return None if doc is None else _load(OrderRecord, doc)

    async def get_orders(self, order_ids: Sequence[str]) -> list[OrderRecord | None]:
        found = {
            doc["_id"]: _load(OrderRecord, doc)
            async for doc in self._orders.find({"_id": {"$in": list(set(order_ids))}})
        }
        return [found.get(order_id) for order_id in order_ids]

    async def get_state(self, order_id: str) -> StateRecord | None:
        doc = await self._state.find_one({"_id": order_id})
        return None if doc is None else _load_state(doc)

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
                {"_id": order_id, **_conditions(expect)},
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
        return _load_state(doc)

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
            return None if doc is None else _load_state(doc)

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
            return None if doc is None else _load_state(doc)

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
        cursor = self._state.find(query).sort([("complete_by", ASCENDING), ("_id", ASCENDING)])
        docs = await cursor.limit(limit).to_list(None)
        return page_of([_load_state(d) for d in docs], limit)

    async def count_by_state(self) -> dict[ProcessState, int]:
        counts = {}
        for state in ProcessState:
            counts[state] = await self._state.count_documents({"process_state": state.value})
        return counts

    async def count_in_states(self, states: frozenset[ProcessState]) -> int:
        query = {"process_state": {"$in": [s.value for s in states]}}
        return int(await self._state.count_documents(query))

    async def workflow_usage(self) -> list[WorkflowUse]:
        pipeline: list[dict[str, Any]] = [
            {
                "$group": {
                    "_id": {
                        "w": "$workflow",
                        "v": "$workflow_version",
                        "s": "$process_state",
                    },
                    "n": {"$sum": 1},
                }
            }
        ]
        cursor = await self._state.aggregate(pipeline)
        rows = [
            (d["_id"]["w"], d["_id"]["v"], d["_id"]["s"], d["n"])
            for d in await cursor.to_list(None)
        ]
        return [WorkflowUse(w, v, ProcessState(s), n) for w, v, s, n in sorted(rows)]

    async def find_stuck_pending(self, *, due_before: datetime, limit: int) -> list[StateRecord]:
        query = {
            "process_state": "Pending",
            "locked_by": None,
            "next_attempt_at": {"$lt": due_before},
        }
        cursor = self._state.find(query).sort("next_attempt_at", ASCENDING).limit(limit)
        return [_load_state(d) for d in await cursor.to_list(None)]

    async def list_states(self, *, after: str | None, limit: int) -> list[StateRecord]:
        query = {} if after is None else {"_id": {"$gt": after}}
        cursor = self._state.find(query).sort("_id", ASCENDING).limit(limit)
        return [_load_state(d) for d in await cursor.to_list(None)]

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
            self._state.find(filter_)
            .sort([("updated_at", DESCENDING), ("_id", DESCENDING)])
            .limit(limit)
        )
        return [_load_state(d) for d in await cursor.to_list(None)]

    async def list_order_ids(self, *, after: str | None, limit: int) -> list[str]:
        query = {} if after is None else {"_id": {"$gt": after}}
        cursor = self._orders.find(query, {"_id": 1}).sort("_id", ASCENDING).limit(limit)
        return [str(d["_id"]) for d in await cursor.to_list(None)]

    # -- history
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
        return [_load(HistoryEvent, d, seq=i) for i, d in enumerate(docs, start=1)]

    # -- compensation log
    async def append_compensation(self, entry: CompensationEntry) -> bool:
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

    async def read_compensation(self, order_id: str) -> list[CompensationEntry]:
        cursor = self._compensation.find({"order_id": order_id}).sort("seq", ASCENDING)
        return [_load(CompensationEntry, d) for d in await cursor.to_list(None)]

    async def _mark_compensation(self, order_id: str, undo: UndoMark) -> None:
        done_at = undo.at if undo.status is UndoStatus.DONE else None
        await self._compensation.update_one(
            {"_id": f"{order_id}|{undo.step}", "status": {"$ne": UndoStatus.DONE.value}},
            {"$set": {"status": undo.status.value, "done_at": done_at, "error": undo.error}},
        )

    # -- retention
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
        return {
            name: int(await self._named(name).count_documents({})) for name in sorted(COLLECTIONS)
        }

    # -- inbox
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

    async def inbox_release(self, queue: str, message_id: str, *, holder: str) -> bool:
        result = await self._inbox.delete_one(
            {"_id": {"q": queue, "m": message_id}, "holder": holder, "state": "processing"}
        )
        return bool(result.deleted_count == 1)

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

    # -- lease
    async def lease_acquire(
        self, name: str, *, holder: str, now: datetime, expires_at: datetime
    ) -> bool:
        if await self.lease_renew(name, holder=holder, now=now, expires_at=expires_at):
            return True
        try:
            # Upsert over a free or expired lease; over a live one held by another the filter
            # matches nothing, the upsert collides on _id, and the lease stays theirs.
            await self._lease.update_one(
                {"_id": name, "$or": [{"expires_at": {"$lte": now}}, {"holder": holder}]},
                {
                    "$set": {
                        "name": name,
                        "holder": holder,
                        "expires_at": expires_at,
                        "acquired_at": now,
                    }
                },
                upsert=True,
            )
        except DuplicateKeyError:
            return False
        return True

    async def lease_renew(
        self, name: str, *, holder: str, now: datetime, expires_at: datetime
    ) -> bool:
        result = await self._lease.update_one(
            {"_id": name, "holder": holder, "expires_at": {"$gt": now}},
            {"$set": {"expires_at": expires_at}},
        )
        return bool(result.matched_count == 1)

    async def lease_release(self, name: str, *, holder: str) -> bool:
        result = await self._lease.delete_one({"_id": name, "holder": holder})
        return bool(result.deleted_count == 1)

    async def lease_get(self, name: str) -> Lease | None:
        doc = await self._lease.find_one({"_id": name})
        return None if doc is None else _load(Lease, doc)

    # -- alerts
    async def raise_alert(self, alert: Alert) -> bool:
        doc = plain(alert)
        doc["_id"] = alert.alert_id
        try:
            await self._alerts.insert_one(doc)
        except DuplicateKeyError:
            return False
        return True

    async def list_alerts(self, *, since: datetime | None = None, limit: int = 100) -> list[Alert]:
        query = {} if since is None else {"at": {"$gte": since}}
        cursor = self._alerts.find(query).sort([("at", DESCENDING), ("_id", ASCENDING)])
        return [_load(Alert, d) for d in await cursor.limit(limit).to_list(None)]

    # -- component status
    async def report_status(self, status: ComponentStatus) -> None:
        doc = plain(status)
        doc["_id"] = status.name
        await self._components.replace_one({"_id": status.name}, doc, upsert=True)

    async def list_status(self, *, now: datetime) -> list[ComponentStatus]:
        cursor = self._components.find({"expires_at": {"$gt": now}}).sort(
            [("kind", ASCENDING), ("_id", ASCENDING)]
        )
        return [_load(ComponentStatus, d) for d in await cursor.to_list(None)]

    async def forget_status(self, name: str) -> None:
        await self._components.delete_one({"_id": name})


async def client_for(
    url: str, *, pool_size: int, timeout: float, command_timeout: float
) -> AsyncMongoClient[dict[str, Any]]:
    """PyMongo's client for the URL, or a `ConfigurationError` for what no retry would fix."""
    try:
        # PyMongo warns of an option it does not know or a value it cannot use, and goes on
        # without it: here that is an error, not a setting quietly dropped.
        with warnings.catch_warnings():
            warnings.simplefilter("error", UserWarning)
            # Retryable writes and reads as the URL says (PyMongo's default: on): the server
            # recognises a retried write and applies it once.
            client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(
                url,
                tz_aware=True,
                maxPoolSize=pool_size,
                serverSelectionTimeoutMS=int(timeout * 1000),
                connectTimeoutMS=int(timeout * 1000),
                timeoutMS=int(command_timeout * 1000),
            )
    except (PyMongoConfigurationError, ValueError, OSError, UserWarning) as exc:
        # OSError: a TLS file (tlsCAFile, tlsCertificateKeyFile) that cannot be read.
        raise ConfigurationError(f"store URL {redact(url)}: {one_line(exc)}") from exc
    if not client.write_concern.acknowledged:
        await client.close()
        raise ConfigurationError(
            f"store URL {redact(url)}: w=0 asks for unacknowledged writes, and every fence of "
            "orderflow (conditional updates, duplicate keys, the lease) needs the server's "
            "answer; use w=1 or w=majority"
        )
    return client


def database_for(client: Any, hub: str) -> tuple[Any, str]:
    """The hub's database on the client, and its collections' prefix (`hub_location`).

    Reads go to the primary whatever the URL's readPreference: a lagging secondary would report
    false conflicts (the duplicate-key path of `insert_order`) and hide this process's own
    writes from it."""
    name, prefix = hub_location(client, hub)
    return client.get_database(name, read_preference=ReadPreference.PRIMARY), prefix


def hub_location(client: Any, hub: str) -> tuple[str, str]:
    """The database a hub's collections live in, and the prefix of their names.

    The URL's database (`mongodb://…/orderflow`, the one its user may write, as in the compose
    deployment) holds every hub: the hub of its own name without a prefix, any other (a
    benchmark's, a test's) under `<hub>.`. A URL that names no database (or a system one, such
    as `/admin` for the authentication) gives each hub a database of its name."""
    try:
        named = str(client.get_default_database().name)
    except PyMongoConfigurationError:
        return hub, ""
    if named in SYSTEM_DATABASES:
        return hub, ""
    return named, ("" if named == hub else f"{hub}.")


def _finished_before(cutoff: datetime) -> dict[str, Any]:
    """State records of orders that finished (Processed, Compensated) before `cutoff`."""
    return {
        "process_state": {"$in": sorted(s.value for s in TERMINAL_STATES)},
        "updated_at": {"$lt": cutoff},
    }


def _conditions(expect: Expect) -> dict[str, Any]:
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
