"""The MongoDB adapter of the state store, through PyMongo's async API.

A hub's collections live in the URL's database (the one its user may write), or, where the URL
names none, in a database of the hub's name (`hub_location`). The server's "try later" answers
(a lost connection, a primary stepping down, a timeout, a write concern not met) are
`StoreUnavailable`. Reads go to the primary and writes must be acknowledged, whatever the URL
asks.

One class per part of the port, each in its module, all sharing the store's one client:

| module            | part                                                         |
|-------------------|--------------------------------------------------------------|
| `connection.py`   | the client, the hub's database, health (`StoreAdmin`)        |
| `errors.py`       | which driver errors are outages, which refusals              |
| `schema.py`       | the indexes (`init`)                                         |
| `states.py`       | insert, read, conditional update, claim (`OrderStates`)      |
| `queries.py`      | scans, listings, counts (`StateQueries`)                     |
| `journal.py`      | history, compensation log, in the state record (`Journal`)   |
| `migration.py`    | the journal's move into the state records (`init`)           |
| `inbox.py`        | MessageId dedupe (`Inbox`)                                   |
| `coordination.py` | lease, alerts, component statuses                            |
| `tokens.py`       | API tokens, by digest (`ApiTokens`)                          |
| `retention.py`    | bounded purges, record counts (`Purges`)                     |
"""

from __future__ import annotations

from typing import Any

from bson.errors import InvalidDocument, InvalidStringData
from pymongo.errors import ConnectionFailure, DocumentTooLarge

from shared.errors import ConfigurationError, ServiceUnavailable
from shared.store.mongo.connection import (
    COLLECTIONS,
    MongoAdmin,
    client_for,
    database_for,
    hub_location,
)
from shared.store.mongo.coordination import MongoCoordination
from shared.store.mongo.errors import is_outage, refuses
from shared.store.mongo.inbox import MongoInbox
from shared.store.mongo.queries import MongoQueries
from shared.store.mongo.retention import MongoRetention
from shared.store.mongo.schema import MongoSchema
from shared.store.mongo.states import MongoStates
from shared.store.mongo.tokens import MongoTokens
from shared.store.unavailable import translate_errors
from shared.store.urls import redact

__all__ = ["COLLECTIONS", "MongoStore", "client_for", "database_for", "hub_location", "is_outage"]


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
    refusal=refuses,
)
class MongoStore(
    MongoAdmin,
    MongoSchema,
    MongoStates,
    MongoQueries,
    MongoInbox,
    MongoCoordination,
    MongoTokens,
    MongoRetention,
):
    """State store on MongoDB: every part of the port over one client and the hub's database."""

    @classmethod
    async def connect(
        cls,
        url: str,
        hub: str,
        *,
        pool_size: int,
        timeout: float,
        command_timeout: float,
        initialising: bool = False,
    ) -> MongoStore:
        client = await client_for(
            url, pool_size=pool_size, timeout=timeout, command_timeout=command_timeout
        )
        return await cls.open(
            client, hub, url=url, recheck_s=command_timeout, initialising=initialising
        )

    @classmethod
    async def open(
        cls,
        client: Any,
        hub: str,
        *,
        url: str = "",
        recheck_s: float = 10.0,
        initialising: bool = False,
    ) -> MongoStore:
        """The hub's store over a client (PyMongo's, or the test stand-in's); checks that the
        server answers, lets the user in and, unless for `orderflow init`, holds the journal in
        this release's layout (`check_layout`); closes the client if not."""
        where = f"MongoDB at {redact(url)}" if url else "MongoDB"
        try:
            db, prefix = database_for(client, hub)
            store = cls(db, client, prefix=prefix, recheck_s=recheck_s)
            await store.ping()
            await store._check_access()
            if not initialising:
                await store.check_layout()
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
