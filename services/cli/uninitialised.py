"""A command run against a hub that `orderflow init` never set up: said so, in our words.

The store's tables and the broker's queues of a hub exist once `orderflow init` (or `up`) has
made them. Before, PostgreSQL answers that a table (or the hub's schema) does not exist and
RabbitMQ that a queue or an exchange does not; this turns either into one line that names the
hub and the command that makes it. (MongoDB creates a collection on first use: a command on a
hub it has never seen finds it empty, and says so as it would of any empty hub.)
"""

from __future__ import annotations

import asyncpg
import click

from services.cli.settings import settings_of
from shared.broker.port import QueueMissing

MISSING_IN_STORE = (
    asyncpg.exceptions.UndefinedTableError,
    asyncpg.exceptions.InvalidSchemaNameError,
)
"""What PostgreSQL raises for a table (or a schema) that does not exist."""


def not_initialised(ctx: click.Context, exc: BaseException) -> str | None:
    """The one-line error for `exc` if it says that the hub was never initialised, else None."""
    settings = settings_of(ctx)
    hub = repr(settings.hub) if settings is not None else "this hub"
    if isinstance(exc, MISSING_IN_STORE):
        where = "in the store (PostgreSQL)"
    elif isinstance(exc, QueueMissing):
        where = "on the broker (RabbitMQ)"
    else:
        return None
    return (
        f"hub {hub} is not initialised {where}: run `orderflow init` "
        f"(with the same ORDERFLOW_HUB and URLs) first; the server said: {_first_line(exc)}"
    )


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
