"""`orderflow dlq …` on the settings' hub: the dead-letter queues of its input queues, over a
connection of the operator's own (the broker I/O: `shared/broker/dead_letters.py`)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Collection
from contextlib import asynccontextmanager
from typing import Any

from aio_pika.abc import AbstractRobustConnection

from shared.bootstrap import open_broker
from shared.broker import dead_letters
from shared.broker.connection import login_user
from shared.broker.senders import Senders
from shared.broker.topology import Names
from shared.config import Settings


@asynccontextmanager
async def _broker(settings: Settings) -> AsyncIterator[AbstractRobustConnection]:
    connection = await open_broker(settings, name="orderflow-dlq")
    try:
        yield connection
    finally:
        await connection.close()


def _sources(settings: Settings, queue: str | None) -> list[str]:
    return dead_letters.source_queues(Names(settings.hub), queue)


async def list_dead_letters(settings: Settings, queue: str | None) -> list[dict[str, Any]]:
    """Every dead letter of one input queue (`orders`, `payment`, …; None: all), described."""
    sources = _sources(settings, queue)
    async with _broker(settings) as connection:
        return await dead_letters.dead_letters(connection, sources)


async def find_dead_letter(
    settings: Settings, message_id: str, queue: str | None
) -> list[dead_letters.Found]:
    sources = _sources(settings, queue)
    async with _broker(settings) as connection:
        return await dead_letters.find(connection, sources, message_id)


async def replay_dead_letters(
    settings: Settings, message_ids: Collection[str] | None, queue: str | None, by: str
) -> dead_letters.Replayed:
    """Replay these dead letters (None: every one) as the operator (the user of
    ORDERFLOW_RABBITMQ_URL), `by` recorded in a header."""
    sources = _sources(settings, queue)
    senders = Senders.of(
        settings.hub, settings.broker_user_prefix, login_user(settings.rabbitmq_url), "operator"
    )
    async with _broker(settings) as connection:
        return await dead_letters.replay(
            connection,
            Names(settings.hub),
            sources,
            message_ids,
            by=by,
            senders=senders,
            publish_timeout_s=settings.publish_timeout_s,
        )


def dead_letter_queues(settings: Settings, queue: str | None) -> list[str]:
    """The dead-letter queues of one input queue (None: of all)."""
    return [Names.dlq(source) for source in _sources(settings, queue)]


async def purge_dead_letters(settings: Settings, queue: str | None) -> dict[str, int]:
    sources = _sources(settings, queue)
    async with _broker(settings) as connection:
        return await dead_letters.purge(connection, sources)
