"""The PostgreSQL store's connection: one asyncpg pool per store, the hub's schema, and what
every part of the adapter shares to read and write rows."""

from __future__ import annotations

import json
from datetime import datetime
from importlib import resources
from typing import Any, TypeVar

import asyncpg
from pydantic import BaseModel

from shared.domain.models import STORED, OrderRecord
from shared.errors import ConfigurationError, ServiceUnavailable, one_line
from shared.store.codec import jsonable
from shared.store.postgres.batches import StatementBatches
from shared.store.urls import redact

NO_HOST_FITS = asyncpg.TargetServerAttributeNotMatched
"""A multi-host URL whose hosts all answer, none as its `target_session_attrs` asks: the
primary is gone and its standby not promoted yet, or all are standbys."""

UNAVAILABLE = (
    OSError,
    TimeoutError,
    asyncpg.InterfaceError,
    asyncpg.PostgresConnectionError,
    asyncpg.OperatorInterventionError,
    asyncpg.TooManyConnectionsError,
    NO_HOST_FITS,
    # A write sent to a server that no longer takes writes: a primary made read-only or
    # demoted under a session that was open. The pool is dropped (`PostgresAdmin.left_server`).
    asyncpg.ReadOnlySQLTransactionError,
)
"""Driver errors that mean the server cannot be reached now (`StoreUnavailable`)."""


def broken_connection(exc: BaseException) -> bool:
    """A pooled connection left mid-protocol by a server that is shutting down: asyncpg can hand
    it out once more before it notices the socket closed, and the next statement on it fails
    client-side ("another operation is in progress"). The server is going away: an outage."""
    return isinstance(exc, asyncpg.InternalClientError) and "another operation" in str(exc)


REFUSED = (
    asyncpg.DataError,  # the server's SQLSTATE class 22: NUL in text, a value out of range
    asyncpg.exceptions._base.DataError,  # the client's: a parameter it cannot encode
    UnicodeEncodeError,
)
"""Driver errors that refuse a value for what it holds (`StoreRefused`)."""

JSON_COLUMNS = frozenset({"steps", "retry_budget", "error", "data"})
STATE_COLUMNS = (
    "order_id",
    "process_state",
    "locked_by",
    "owner",
    "complete_by",
    "failure_count",
    "attempt",
    "workflow",
    "workflow_version",
    "schema_version",
    "steps",
    "retry_budget",
    "reply_to",
    "next_attempt_at",
    "error",
    "created_at",
    "updated_at",
)
STATE_TYPES = {
    "order_id": "text",
    "process_state": "text",
    "locked_by": "text",
    "owner": "text",
    "complete_by": "timestamptz",
    "failure_count": "int",
    "attempt": "int",
    "workflow": "text",
    "workflow_version": "int",
    "schema_version": "int",
    "steps": "jsonb",
    "retry_budget": "jsonb",
    "reply_to": "text",
    "next_attempt_at": "timestamptz",
    "error": "jsonb",
    "created_at": "timestamptz",
    "updated_at": "timestamptz",
}
"""Each state column's type, for a statement whose parameters PostgreSQL cannot type from
their place (an INSERT from a SELECT)."""


async def create_pool(
    url: str, *, pool_size: int, timeout: float, command_timeout: float
) -> asyncpg.Pool:
    """The store's one pool, or the error that says why there is none."""
    try:
        return await asyncpg.create_pool(
            url,
            min_size=1,
            max_size=pool_size,
            timeout=timeout,
            command_timeout=command_timeout,
            init=_init_connection,
            reset=_reset_connection,
        )
    except (ValueError, asyncpg.InterfaceError) as exc:
        raise ConfigurationError(f"store URL {redact(url)}: {one_line(exc)}") from exc
    except (OSError, asyncpg.PostgresError, TimeoutError, NO_HOST_FITS) as exc:
        raise ServiceUnavailable(
            f"PostgreSQL at {redact(url)} is unreachable: {one_line(exc)}"
        ) from exc


async def _init_connection(conn: asyncpg.Connection) -> None:
    await conn.set_type_codec("jsonb", encoder=json.dumps, decoder=json.loads, schema="pg_catalog")


async def _reset_connection(connection: asyncpg.Connection) -> None:
    """What a connection needs before it goes back to the pool. The store opens no cursors,
    listens to nothing, takes no advisory locks and sets no session variables, so asyncpg's
    default reset (a round trip of four statements on every release, ~15% of a scheduler's
    CPU) is replaced by ending a transaction that was left open, if any."""
    if connection.is_in_transaction():
        await connection.execute("ROLLBACK")


class PostgresPart:
    """What every part of the PostgreSQL store shares: one pool, one schema (a task hub)."""

    kind = "postgresql"

    def __init__(self, pool: asyncpg.Pool, schema: str) -> None:
        self._pool = pool
        self._s = f'"{schema}"'
        self._schema = schema
        self._batches = StatementBatches(pool)
        """One-record writes made side by side, sent together (shared/store/postgres/batches.py)."""
        self._server_changes = 0
        """How many times the store left a server that stopped taking writes (`left_server`)."""


class PostgresAdmin(PostgresPart):
    """The schema, the server's health and the pool (`StoreAdmin`)."""

    async def init(self) -> None:
        ddl = resources.files("shared.store.postgres").joinpath("schema.sql").read_text()
        async with self._pool.acquire() as conn, conn.transaction():
            # Two processes initialising at once would race on CREATE ... IF NOT EXISTS.
            await conn.execute("SELECT pg_advisory_xact_lock(hashtext('orderflow-init'))")
            await conn.execute(ddl.replace("{schema}", self._schema))

    async def ping(self) -> None:
        try:
            await self._pool.fetchval("SELECT 1")
        except (OSError, asyncpg.PostgresError) as exc:
            raise ServiceUnavailable(f"PostgreSQL does not answer: {one_line(exc)}") from exc

    async def close(self) -> None:
        await self._pool.close()

    async def left_server(self, exc: BaseException) -> None:
        """After an outage: if the server refused a write as read-only, every pooled connection
        is dropped as it comes back, and the next ones connect again through the URL's hosts,
        which `target_session_attrs=read-write` sends to the new primary. A lost connection
        needs nothing: the pool replaces it by itself."""
        if isinstance(exc, asyncpg.ReadOnlySQLTransactionError):
            self._server_changes += 1
            await self._pool.expire_connections()

    async def drop(self) -> None:
        await self._pool.execute(f"DROP SCHEMA IF EXISTS {self._s} CASCADE")


def column_value(name: str, value: Any) -> Any:
    """A state field as its column takes it: JSON for the JSON columns."""
    return jsonable(value) if name in JSON_COLUMNS else jsonable_scalar(value)


def jsonable_scalar(value: Any) -> Any:
    """Enums to values; datetimes stay datetimes for timestamptz columns."""
    return getattr(value, "value", value) if not isinstance(value, datetime) else value


def affected(status: str) -> int:
    """asyncpg returns a command tag such as 'UPDATE 1'."""
    return int(status.rsplit(" ", 1)[-1])


M = TypeVar("M", bound=BaseModel)


def read_row(model: type[M], row: asyncpg.Record) -> M:
    """A record as stored: read under the STORED context (its text is not re-judged)."""
    return model.model_validate(dict(row), strict=False, context=STORED)


def order_from(row: asyncpg.Record) -> OrderRecord:
    doc = dict(row)
    del doc["order_id"]
    return OrderRecord.model_validate(doc, strict=False, context=STORED)
