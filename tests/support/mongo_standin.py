"""An in-process stand-in for a MongoDB server: mongomock behind PyMongo's async API.

It is NOT MongoDB. It lets the MongoDB adapter's code run through the contract suite where no
MongoDB server can be reached; the tests that use it carry the `mongodb_standin` marker and say so
in their ids. Each call yields to the event loop first, so concurrent callers interleave between
operations (each single-document operation stays atomic, as in MongoDB).

Beyond mongomock it plays the parts of a server the adapter must cope with, each as MongoDB
documents it, so that a test can be written once and run here and against a real server:

- **`failCommand`**: `admin.command("configureFailPoint", "failCommand", mode=..., data=...)` with
  MongoDB's own fields (`failCommands`, `errorCode`, `errorLabels`, `writeConcernError`,
  `closeConnection`; modes `alwaysOn`, `off`, `{"times": n}`, `{"skip": n}`). A command error fails
  the command before it runs; a `writeConcernError` fails it after it applied, as a primary does
  when replication does not confirm. The errors are PyMongo's, raised as PyMongo raises them
  (`NotPrimaryError` for the not-primary and shutdown codes, `ExecutionTimeout` for 50,
  `WTimeoutError` for 64, `AutoReconnect` for a closed connection). PyMongo's own retry of a
  retryable write is not played: a real server with `retryWrites` may hide a single failure.
- **Users and roles**: a server made with `users` authenticates its clients (a wrong password or
  source fails with code 18, as PyMongo reports it) and authorizes each command by the roles
  `read`, `readWrite`, `dbAdmin`, `dbOwner` and `root` (code 13, Unauthorized), like the
  `orderflow` user the compose init script creates (`readWrite` on its database only).
- **Indexes**: an index whose name or keys exist with other options fails as `createIndexes`
  does (85 IndexOptionsConflict, 86 IndexKeySpecsConflict), TTL indexes are kept so that
  `ttl_pass(now)` deletes what the server's TTL monitor would, and a unique index with a partial
  filter holds only among the documents the filter names (mongomock's own unique check).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import bson
import mongomock
from pymongo.errors import (
    AutoReconnect,
    BulkWriteError,
    ExecutionTimeout,
    NotPrimaryError,
    OperationFailure,
    WriteConcernError,
    WTimeoutError,
)

COMMANDS = {
    "insert_one": "insert",
    "insert_many": "insert",
    "update_one": "update",
    "update_many": "update",
    "bulk_write": "update",
    "replace_one": "update",
    "find_one_and_update": "findAndModify",
    "find_one_and_replace": "findAndModify",
    "find_one_and_delete": "findAndModify",
    "delete_one": "delete",
    "delete_many": "delete",
    "find_one": "find",
    "find": "find",
    "count_documents": "aggregate",
    "estimated_document_count": "count",
    "aggregate": "aggregate",
    "create_index": "createIndexes",
    "drop_index": "dropIndexes",
    "drop": "drop",
}
"""The MongoDB command each collection method sends (as PyMongo sends it)."""

WRITES = frozenset(
    {"insert", "update", "findAndModify", "delete", "createIndexes", "dropIndexes", "drop"}
)
READS = frozenset({"find", "aggregate", "count"})
NOT_PRIMARY_CODES = frozenset({10058, 10107, 13435, 13436, 11602, 189, 91, 11600})
"""The codes PyMongo raises as `NotPrimaryError` (its `_NOT_PRIMARY_CODES`)."""
ROLE_ACTIONS = {
    "read": READS,
    "readWrite": READS | WRITES,
    "dbAdmin": READS | {"createIndexes", "drop", "dropDatabase"},
    "dbOwner": READS | WRITES | {"dropDatabase"},
}


@dataclass
class User:
    password: str
    roles: list[tuple[str, str]]
    """(role, database) pairs; `root` on `admin` may do everything everywhere."""


@dataclass
class _FailPoint:
    mode: Any = "off"
    data: dict[str, Any] = field(default_factory=dict)
    seen: int = 0
    fired: int = 0

    def fires(self, command: str) -> bool:
        if self.mode == "off" or command not in self.data.get("failCommands", []):
            return False
        self.seen += 1
        if self.mode == "alwaysOn":
            return True
        if "skip" in self.mode:
            return self.seen > int(self.mode["skip"])
        if self.fired >= int(self.mode["times"]):
            return False
        self.fired += 1
        return True


class StandInServer:
    """One stand-in server: its data, users, indexes and fail point, shared by its clients."""

    def __init__(self, users: dict[tuple[str, str], User] | None = None) -> None:
        self.mm = mongomock.MongoClient(tz_aware=True)
        self.users = users or {}
        """(authentication database, user name) → user; none: no authentication."""
        self.fail_point = _FailPoint()
        self.commands: Counter[str] = Counter()
        """How many times each command ran (or was tried)."""
        self.trips: Counter[tuple[str, str]] = Counter()
        """How many times each command ran on each collection (`""` for a database's own),
        as PyMongo's command monitoring would count the round trips."""
        self.indexes: dict[tuple[str, str], dict[str, tuple[list[tuple[str, int]], dict[str, Any]]]]
        self.indexes = {}

    # -- the TTL monitor
    def ttl_pass(self, now: datetime) -> int:
        """Delete what the server's TTL monitor would at `now` (it runs every 60 s)."""
        deleted = 0
        for (db, collection), specs in self.indexes.items():
            for keys, options in specs.values():
                if "expireAfterSeconds" not in options:
                    continue
                cutoff = now - timedelta(seconds=options["expireAfterSeconds"])
                result = self.mm[db][collection].delete_many({keys[0][0]: {"$lte": cutoff}})
                deleted += result.deleted_count
        return deleted

    # -- authorization
    def authorize(self, user: User | None, db: str, command: str) -> None:
        if not self.users or command in {"ping", "hello"}:
            return
        if user is None:
            raise OperationFailure(
                f"Command {command} requires authentication", 13, {"codeName": "Unauthorized"}
            )
        for role, role_db in user.roles:
            if role == "root" and role_db == "admin":
                return
            if role_db == db and command in ROLE_ACTIONS.get(role, frozenset()):
                return
        raise OperationFailure(
            f"not authorized on {db} to execute command {{ {command}: ... }}",
            13,
            {"codeName": "Unauthorized"},
        )

    # -- failCommand
    def configure_fail_point(self, mode: Any, data: dict[str, Any] | None) -> None:
        self.fail_point = _FailPoint(mode, dict(data or {}))

    def before(self, command: str) -> dict[str, Any] | None:
        """Raise the fail point's command error, if it fires; the write-concern error to raise
        after the command applied, if that is what it holds."""
        if not self.fail_point.fires(command):
            return None
        data = self.fail_point.data
        labels = list(data.get("errorLabels", []))
        if data.get("closeConnection"):
            raise AutoReconnect("stand-in:27017: connection closed")
        if "errorCode" in data:
            code = int(data["errorCode"])
            message = f"failCommand {code}"
            details = {"ok": 0, "code": code, "errmsg": message, "errorLabels": labels}
            if code in NOT_PRIMARY_CODES:
                raise NotPrimaryError(message, details)
            if code == 50:
                raise ExecutionTimeout(message, code, details)
            raise OperationFailure(message, code, details)
        if "writeConcernError" in data:
            return {**data["writeConcernError"], "errorLabels": labels}
        return None


def after_write(method: str, concern: dict[str, Any], result: Any) -> None:
    """Raise a write-concern error for a write that applied, as PyMongo does for its kind."""
    code = int(concern.get("code", 64))
    message = str(concern.get("errmsg", "waiting for replication timed out"))
    details = {"code": code, "errmsg": message, "errorLabels": concern.get("errorLabels", [])}
    if method == "insert_many":
        n = len(getattr(result, "inserted_ids", []))
        raise BulkWriteError(
            {"writeErrors": [], "writeConcernErrors": [details], "nInserted": n, "upserted": []}
        )
    if method == "bulk_write":
        raise BulkWriteError(
            {
                "writeErrors": [],
                "writeConcernErrors": [details],
                "nModified": result.modified_count,
                "nMatched": result.matched_count,
                "upserted": [],
            }
        )
    if method.startswith("find_one_and_"):
        raise WriteConcernError(message, code, details)
    if code == 64:
        raise WTimeoutError(message, code, details)
    raise WriteConcernError(message, code, details)


def _encode_like_the_driver(args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """PyMongo encodes every document it sends as BSON and refuses what BSON cannot hold (NUL
    in a key, an integer beyond 64 bits, an unpaired surrogate); mongomock does not. Encoding
    here makes the stand-in refuse the same writes the driver would."""
    for value in (*args, *kwargs.values()):
        for doc in value if isinstance(value, list) else [value]:
            if isinstance(doc, dict):
                bson.encode(doc)


class _Session:
    """What a client's commands go through: authorization, then the fail point."""

    def __init__(self, server: StandInServer, user: User | None, auth_error: str | None) -> None:
        self.server = server
        self.user = user
        self.auth_error = auth_error

    async def run(
        self, db: str, method: str, call: Callable[[], Any], *, collection: str = ""
    ) -> Any:
        await asyncio.sleep(0)
        command = COMMANDS.get(method, method)
        self.server.commands[command] += 1
        self.server.trips[command, collection] += 1
        if self.auth_error is not None:
            raise OperationFailure(self.auth_error, 18, {"codeName": "AuthenticationFailed"})
        self.server.authorize(self.user, db, command)
        concern = self.server.before(command)
        result = call()
        if concern is not None and command in WRITES:
            after_write(method, concern, result)
        return result


class _Cursor:
    def __init__(
        self, session: _Session, db: str, cursor: Any, *, ran: bool = False, collection: str = ""
    ) -> None:
        self._session = session
        self._db = db
        self._collection = collection
        self._cursor = cursor
        self._started = ran
        """Whether the command ran already (an aggregate's, when it was sent)."""

    def sort(self, *args: Any, **kwargs: Any) -> _Cursor:
        self._cursor = self._cursor.sort(*args, **kwargs)
        return self

    def limit(self, n: int) -> _Cursor:
        self._cursor = self._cursor.limit(n)
        return self

    async def to_list(self, length: int | None = None) -> list[Any]:
        if self._started:
            await asyncio.sleep(0)
            docs = list(self._cursor)
        else:
            self._started = True
            docs = await self._session.run(
                self._db, "find", lambda: list(self._cursor), collection=self._collection
            )
        return docs if length is None else docs[:length]

    def __aiter__(self) -> _Cursor:
        return self

    async def __anext__(self) -> Any:
        if not self._started:
            self._started = True
            await self._session.run(self._db, "find", lambda: None, collection=self._collection)
        await asyncio.sleep(0)
        try:
            return next(self._cursor)
        except StopIteration:
            raise StopAsyncIteration from None


class _Collection:
    def __init__(self, session: _Session, db: str, name: str) -> None:
        self._session = session
        self._db = db
        self.name = name
        self._c = session.server.mm[db][name]

    def with_options(self, **options: Any) -> _Collection:
        """The same collection: the stand-in is one node, whose reads see every write."""
        return self

    def find(self, *args: Any, **kwargs: Any) -> _Cursor:
        found = self._c.find(*args, **kwargs)
        return _Cursor(self._session, self._db, found, collection=self.name)

    async def aggregate(self, pipeline: list[dict[str, Any]], **kwargs: Any) -> _Cursor:
        docs = await self._session.run(
            self._db,
            "aggregate",
            lambda: iter(self._c.aggregate(pipeline, **kwargs)),
            collection=self.name,
        )
        return _Cursor(self._session, self._db, docs, ran=True, collection=self.name)

    async def create_index(self, keys: Any, **kwargs: Any) -> str:
        pairs = [(keys, 1)] if isinstance(keys, str) else [(k, int(d)) for k, d in keys]
        name = kwargs.pop("name", "_".join(f"{k}_{d}" for k, d in pairs))
        options = dict(kwargs)

        def create() -> str:
            self._check_index(name, pairs, options)
            self._session.server.indexes.setdefault((self._db, self.name), {})[name] = (
                pairs,
                options,
            )
            # mongomock ignores partial filters and TTLs: the stand-in keeps them itself. Except
            # in one place: its check of a unique index applies the index's partial filter (as
            # MongoDB does, only the documents it names must be unique), so a unique index's
            # filter is handed on (API tokens: one active token per name, revoked ones aside).
            rest = {k: v for k, v in options.items() if k not in _KEPT_OPTIONS}
            if options.get("unique") and "partialFilterExpression" in options:
                rest["partialFilterExpression"] = options["partialFilterExpression"]
            return str(self._c.create_index(pairs, name=name, **rest))

        return str(await self._session.run(self._db, "create_index", create, collection=self.name))

    async def drop_index(self, name: str) -> None:
        def drop() -> None:
            indexes = self._session.server.indexes.get((self._db, self.name), {})
            if name not in indexes:
                raise OperationFailure(
                    f"index not found with name [{name}]", 27, {"codeName": "IndexNotFound"}
                )
            del indexes[name]
            self._c.drop_index(name)

        await self._session.run(self._db, "drop_index", drop, collection=self.name)

    def _check_index(self, name: str, keys: list[tuple[str, int]], options: dict[str, Any]) -> None:
        for other, (other_keys, other_options) in self._session.server.indexes.get(
            (self._db, self.name), {}
        ).items():
            same_filter = other_options.get("partialFilterExpression") == options.get(
                "partialFilterExpression"
            )
            if other == name and other_keys != keys:
                raise _index_conflict(86, f"same name, a different key spec: {name}")
            if other == name and other_options != options:
                raise _index_conflict(85, f"same name, different options: {name}")
            if other != name and other_keys == keys and same_filter:
                raise _index_conflict(85, f"already exists with a different name: {other}")

    async def find_one_and_update(
        self,
        filter: dict[str, Any],
        update: dict[str, Any],
        projection: Any = None,
        *,
        return_document: bool = False,
        upsert: bool = False,
        **kwargs: Any,
    ) -> Any:
        """As MongoDB does it; mongomock's own applies a positional `$` (`undo_log.$.status`)
        to the wrong element, where its `update_one` gets it right. So: the document the filter
        finds, updated by `update_one` under the same filter, in one step (nothing runs between
        them: atomic, as a server's single-document write). mongomock also forgets the matched
        position once it applied a `$push`, so `$set` goes first (MongoDB applies an update's
        operators as one)."""
        _encode_like_the_driver((filter, update), {})
        update = dict(sorted(update.items(), key=lambda item: item[0] != "$set"))

        def apply() -> Any:
            if upsert:
                return self._c.find_one_and_update(
                    filter, update, projection, return_document=return_document, upsert=True
                )
            found = self._c.find_one(filter, {"_id": 1}, **kwargs)
            if found is None:
                return None
            key = {"_id": found["_id"]}
            before = self._c.find_one(key, projection)
            self._c.update_one({**filter, **key}, update)
            return self._c.find_one(key, projection) if return_document else before

        return await self._session.run(self._db, "find_one_and_update", apply, collection=self.name)

    async def bulk_write(self, requests: list[Any], *, ordered: bool = True) -> Any:
        """Update requests only (`UpdateOne`), each applied as `update_one`, in one command;
        mongomock's own does not take PyMongo 4's requests. Unlike a server, which lets other
        writers in between a bulk's operations, the stand-in applies them in one step: each
        write the adapter sends in a bulk is conditional on its own record, so none relies on
        the other's company (and a write concern error still comes after all applied)."""
        for request in requests:
            _encode_like_the_driver((request._filter, request._doc), {})

        def apply() -> Any:
            results = [self._c.update_one(r._filter, r._doc, upsert=r._upsert) for r in requests]
            return _BulkResult(
                sum(r.matched_count for r in results), sum(r.modified_count for r in results)
            )

        return await self._session.run(self._db, "bulk_write", apply, collection=self.name)

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._c, name)

        async def call(*args: Any, **kwargs: Any) -> Any:
            if COMMANDS.get(name) in WRITES:
                _encode_like_the_driver(args, kwargs)
            if name == "drop":
                self._session.server.indexes.pop((self._db, self.name), None)
            return await self._session.run(
                self._db, name, lambda: method(*args, **kwargs), collection=self.name
            )

        return call


@dataclass(frozen=True)
class _BulkResult:
    matched_count: int
    modified_count: int


def _index_conflict(code: int, what: str) -> OperationFailure:
    name = {85: "IndexOptionsConflict", 86: "IndexKeySpecsConflict"}[code]
    return OperationFailure(f"{name}: an index {what}", code, {"codeName": name})


_KEPT_OPTIONS = frozenset({"partialFilterExpression", "expireAfterSeconds"})


class StandInDatabase:
    """The part of `AsyncDatabase` the adapter uses."""

    def __init__(self, name: str, client: StandInClient | None = None, **options: Any) -> None:
        self.name = name
        self.client = client if client is not None else StandInClient(StandInServer())
        self.options = options
        """What the adapter asked of the database (PyMongo's `read_preference`, …)."""

    def __getitem__(self, name: str) -> _Collection:
        return _Collection(self.client.session, self.name, name)

    async def command(self, name: str, *args: Any, **kwargs: Any) -> dict[str, Any]:
        await self.client.session.run(self.name, name, lambda: None)
        return {"ok": 1.0}

    async def list_collection_names(self) -> list[str]:
        names = await self.client.session.run(
            self.name, "find", self.client.server.mm[self.name].list_collection_names
        )
        return list(names)


class _Admin:
    def __init__(self, client: StandInClient) -> None:
        self._client = client

    async def command(self, name: str, *args: Any, **kwargs: Any) -> dict[str, Any]:
        if name != "configureFailPoint" or args != ("failCommand",):
            return await StandInDatabase("admin", self._client).command(name)
        self._client.server.authorize(self._client.session.user, "admin", "configureFailPoint")
        self._client.server.configure_fail_point(kwargs.get("mode"), kwargs.get("data"))
        return {"ok": 1.0}


class StandInClient:
    """The part of `AsyncMongoClient` the adapter uses, logged in as `username` (if any)."""

    def __init__(
        self,
        server: StandInServer,
        *,
        username: str | None = None,
        password: str | None = None,
        auth_source: str = "admin",
        database: str | None = None,
    ) -> None:
        self.server = server
        self._default = database
        user = None
        error = None
        if username is not None:
            user = server.users.get((auth_source, username))
            if user is None or user.password != password:
                user, error = None, "Authentication failed."
        self.session = _Session(server, user, error)
        self.admin = _Admin(self)
        self.closed = False

    def get_database(self, name: str, **options: Any) -> StandInDatabase:
        return StandInDatabase(name, self, **options)

    def get_default_database(self) -> StandInDatabase:
        if self._default is None:
            from pymongo.errors import ConfigurationError

            raise ConfigurationError("No default database name defined or provided.")
        return self.get_database(self._default)

    def __getitem__(self, name: str) -> StandInDatabase:
        return self.get_database(name)

    async def drop_database(self, name: str) -> None:
        await self.session.run(name, "dropDatabase", lambda: self.server.mm.drop_database(name))

    async def close(self) -> None:
        self.closed = True


APP_DATABASE = "orderflow"
APP_PASSWORD = "app-password"
ROOT_PASSWORD = "root-password"


def compose_server() -> StandInServer:
    """A server with the compose deployment's users: `root` (the image's, `root` on `admin`) and
    `orderflow`, as infra/mongodb/init-orderflow.js creates it: `readWrite` on its database
    only, authenticated there."""
    return StandInServer(
        users={
            ("admin", "root"): User(ROOT_PASSWORD, [("root", "admin")]),
            (APP_DATABASE, "orderflow"): User(APP_PASSWORD, [("readWrite", APP_DATABASE)]),
        }
    )


def app_client(server: StandInServer, *, password: str = APP_PASSWORD) -> StandInClient:
    """A client logged in as the compose application user, with the compose store URL's
    database (`mongodb://orderflow:…@mongodb:27017/orderflow?authSource=orderflow`)."""
    return StandInClient(
        server,
        username="orderflow",
        password=password,
        auth_source=APP_DATABASE,
        database=APP_DATABASE,
    )


def root_client(server: StandInServer) -> StandInClient:
    return StandInClient(server, username="root", password=ROOT_PASSWORD)
