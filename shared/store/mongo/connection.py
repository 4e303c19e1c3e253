"""The MongoDB store's connection: one client per store, the hub's database and collections,
and what every part of the adapter shares to read and write documents."""

from __future__ import annotations

import warnings
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from pymongo import AsyncMongoClient, ReadPreference
from pymongo.errors import ConfigurationError as PyMongoConfigurationError
from pymongo.errors import OperationFailure, PyMongoError
from pymongo.read_concern import ReadConcern
from pymongo.write_concern import WriteConcern
from tenacity import (
    AsyncRetrying,
    retry_if_exception,
    stop_after_delay,
    wait_exponential_jitter,
)

from shared.domain.models import STORED, StateRecord
from shared.errors import ConfigurationError, ServiceUnavailable, one_line
from shared.store.codec import plain, state_from
from shared.store.mongo.errors import AUTH_CODES, is_outage
from shared.store.urls import redact

COLLECTIONS = frozenset(
    {
        "orders",
        "state",
        "inbox",
        "lease",
        "alerts",
        "components",
        "api_tokens",
    }
)
"""Every collection of a hub's database."""
OLD_COLLECTIONS = frozenset({"history", "compensation_log", "counters"})
"""The journal's collections before layout 2 (shared/store/mongo/migration.py)."""
SYSTEM_DATABASES = frozenset({"admin", "local", "config"})

T = TypeVar("T")


class MongoPart:
    """What every part of the MongoDB store shares: one client, the hub's database and its
    collections. `db` is an `AsyncDatabase` (or the test stand-in's facade)."""

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
        self._inbox = self._named("inbox")
        self._lease = self._named("lease")
        self._alerts = self._named("alerts")
        self._components = self._named("components")
        self._tokens = self._named("api_tokens")

    def _named(self, name: str) -> Any:
        """The hub's collection of that name (under the hub's prefix: `hub_location`)."""
        return self._db[f"{self._prefix}{name}"]

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


class MongoAdmin(MongoPart):
    """The server's health, access and the hub's collections (`StoreAdmin`; the indexes are
    `MongoSchema`'s)."""

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
        for name in sorted(COLLECTIONS | OLD_COLLECTIONS):
            await self._named(name).drop()


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
    weaker = weaker_concern(client)
    if weaker is not None:
        await client.close()
        raise ConfigurationError(
            f"store URL {redact(url)}: {weaker}; orderflow writes and reads with a majority "
            "whatever the URL says: leave it out, or say w=majority and readConcernLevel=majority"
        )
    return client


MAJORITY = "majority"


def weaker_concern(client: Any) -> str | None:
    """What of the URL's write or read concern is weaker than a majority's, if anything.

    An acknowledgement a failover can take back breaks the fences: a claim confirmed by one
    member and rolled back reissues its fencing token, a conditional update confirmed and rolled
    back lets another writer's apply over it. So every write waits for a majority, every read
    (an outcome-unknown one's re-read included) sees only what a majority has; one exception,
    `insert_order`'s duplicate-key read, asks the primary's own view
    (decision:orders-deduped-by-order)."""
    written = client.write_concern.document.get("w")
    if written is not None and written != MAJORITY:
        return f"w={written} does not wait for a majority to have a write"
    level = client.read_concern.level
    if level is not None and level != MAJORITY:
        return f"readConcernLevel={level} reads what a failover may take back"
    return None


def majority_concerns(client: Any) -> dict[str, Any]:
    """The write and read concerns of the store's database: a majority's, with the URL's own
    write timeout and journal choice kept (a client without concerns, the test stand-in's,
    gets the same, which it records)."""
    written = dict(getattr(client, "write_concern", WriteConcern()).document)
    written.pop("w", None)  # the rest are WriteConcern's keywords: wtimeout, j, fsync
    return {
        "write_concern": WriteConcern(w=MAJORITY, **written),
        "read_concern": ReadConcern(MAJORITY),
    }


def database_for(client: Any, hub: str) -> tuple[Any, str]:
    """The hub's database on the client, and its collections' prefix (`hub_location`).

    Reads go to the primary whatever the URL's readPreference: a lagging secondary would report
    false conflicts (the duplicate-key path of `insert_order`) and hide this process's own
    writes from it. Writes wait for a majority and reads see a majority's (`weaker_concern`)."""
    name, prefix = hub_location(client, hub)
    database = client.get_database(
        name, read_preference=ReadPreference.PRIMARY, **majority_concerns(client)
    )
    return database, prefix


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


LAYOUT = 2
"""The state record's layout: 2 holds its order's journal (shared/store/mongo/journal.py); a
record without `layout` is of the layout before, which `orderflow init` migrates
(shared/store/mongo/migration.py)."""
JOURNAL_FIELDS = ("layout", "history", "history_count", "undo_log")
RECORD = dict.fromkeys(JOURNAL_FIELDS, 0)
"""The projection of a state record without its journal: what every read of the record asks
for (the journal is read on its own, by `read_history` and `read_compensation`)."""


def state_doc(state: StateRecord, history: list[dict[str, Any]]) -> dict[str, Any]:
    """A new state record's document, with its first events (`journal.events_doc`)."""
    doc: dict[str, Any] = plain(state)
    doc["_id"] = state.order_id
    doc |= {"layout": LAYOUT, "history": history, "history_count": len(history), "undo_log": []}
    return doc


def load_state(doc: dict[str, Any]) -> StateRecord:
    for name in ("_id", *JOURNAL_FIELDS):
        doc.pop(name, None)
    return state_from(plain(doc))


def load(model: Any, doc: dict[str, Any], **extra: Any) -> Any:
    doc.pop("_id", None)
    return model.model_validate(plain({**doc, **extra}), strict=False, context=STORED)
