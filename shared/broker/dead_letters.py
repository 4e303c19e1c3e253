"""The dead-lettered messages of each input queue: list, show, replay, purge.

Reading never loses a message, nor spends a delivery of it: the messages are fetched
unacknowledged and each one a replay does not remove goes back to its dead-letter queue with
`basic.nack` (requeue), which RabbitMQ 4.3 and later count as no delivery. Going back with the
channel's close, as they did, counts as a failed delivery on every version (as a consumer's
crash does), and RabbitMQ 4.x drops a quorum queue's message past its delivery limit, 20 unless
set, with no dead-letter exchange behind a DLQ: the twenty-first listing lost every letter. On
4.0-4.2 every return counts, `basic.nack` too: there the generated definitions' policy lifts the
DLQs' limit (`dead_letter_policy` in deployment/rabbitmq.py; 3.x has none by default).

A replay publishes the message, with its original `message_id`, to the queue it came
from (through that queue's replay exchange, the only way the operator's user has into it) and
removes it from the dead-letter queue only once the broker confirmed the publish; so dedupe
still holds (a message whose id was handled already is dropped as a duplicate, not handled
twice). The queue's consumer accepts a replay only with the seal it put on the dead letter, as
the message of its original sender; a message the broker dead-lettered on its own (its delivery
limit) has no seal, and its replay is refused (`unauthorised`) unless the operator runs as the
consumer's user.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from shared.broker.consumer import DEAD_LETTERED_AT, DELIVERIES, ERROR, REASON, SOURCE_QUEUE
from shared.broker.envelope import SEAL, SENDER, carried_headers
from shared.broker.port import Connection, Feed, Incoming, Outgoing
from shared.broker.publisher import Publisher
from shared.broker.senders import Senders
from shared.broker.topology import Names
from shared.domain.durations import human_age
from shared.domain.redaction import redact_shown
from shared.domain.text import printable
from shared.domain.timing import utcnow
from shared.errors import BadInput

REPLAYED_AT = "x-orderflow-replayed-at"
REPLAYED_BY = "x-orderflow-replayed-by"


def source_queues(names: Names, queue: str | None) -> list[str]:
    """The input queues asked for: all, or one named `orders`, `payment`, `agent.payment` or in
    full (`<hub>.agent.payment`, with or without `.dlq`)."""
    queues = names.input_queues()
    if queue is None:
        return queues
    wanted = queue.removesuffix(".dlq")
    for q in queues:
        short = q.removeprefix(f"{names.hub}.")
        if wanted in (q, short, short.removeprefix("agent.")):
            return [q]
    choices = ", ".join(q.removeprefix(f"{names.hub}.") for q in queues)
    raise BadInput(f"no input queue {queue!r} in hub {names.hub} (one of: {choices})")


def header_value(value: Any) -> Any:
    """A header as JSON can hold it: a value that is not text (bytes a sender wrote, which the
    broker kept) as its escaped text, so no listing fails on it."""
    if value is None or isinstance(value, str | int | float | bool):
        return value
    if isinstance(value, bytes | bytearray):
        return printable(bytes(value).decode("utf-8", "backslashreplace"))
    return printable(repr(value))


def broker_made(message: Incoming) -> dict[str, Any] | None:
    """The broker's own record of dead-lettering this message (its `x-death` header), when the
    broker put it in the DLQ itself (its delivery limit, a message's TTL), not our consumer: the
    message is then as its sender wrote it, and its `x-orderflow-…` headers are the sender's."""
    deaths = (message.headers or {}).get("x-death")
    if not isinstance(deaths, list):
        return None
    first = deaths[0] if deaths and isinstance(deaths[0], dict) else {}
    at = first.get("time")
    shown = {k: header_value(v) for k, v in first.items()}
    return shown | {"time": at if isinstance(at, datetime) else None}


def describe(source: str, message: Incoming, now: datetime) -> dict[str, Any]:
    """A dead letter of the input queue `source`: why, when, how often it was delivered."""
    death = broker_made(message)
    if death is not None:
        # None of our headers on it are ours: what the broker says instead.
        at = death.get("time")
        return {
            "queue": source,
            "message_id": message.message_id,
            "type": message.type,
            "reason": f"broker-{death.get('reason')}",
            "error": "dead-lettered by the broker itself, as its sender wrote it "
            "(its x-orderflow headers, if any, are the sender's)",
            "dead_lettered_at": at.isoformat() if at is not None else None,
            "age": human_age(at, now),
            "deliveries": death.get("count"),
            "source_queue": source,
            "bytes": len(message.body),
        }
    headers = {k: header_value(v) for k, v in (message.headers or {}).items()}
    at = headers.get(DEAD_LETTERED_AT)
    try:
        when = datetime.fromisoformat(str(at)) if at else None
    except ValueError:
        when = None
    return {
        "queue": source,
        "message_id": message.message_id,
        "type": message.type,
        "reason": headers.get(REASON),
        "error": headers.get(ERROR),
        "dead_lettered_at": at,
        "age": human_age(when, now),
        "deliveries": headers.get(DELIVERIES),
        "source_queue": headers.get(SOURCE_QUEUE) or source,
        "bytes": len(message.body),
    }


async def _fetch(feed: Feed, source: str) -> list[Incoming]:
    """Every message of the source queue's DLQ, unacknowledged (`give_back` returns them)."""
    got: list[Incoming] = []
    while (message := await feed.get(Names.dlq(source))) is not None:
        got.append(message)
    return got


async def _each(
    connection: Connection,
    sources: list[str],
    visit: Callable[[str, Incoming], Awaitable[None]],
) -> None:
    """`visit` each dead letter of each source queue, one channel per queue; the letters not
    acknowledged go back, uncounted where the broker can (see the module's docstring)."""
    for source in sources:
        feed = await connection.feed(prefetch=0)
        try:
            letters = await _fetch(feed, source)
            try:
                for message in letters:
                    await visit(source, message)
            finally:
                await give_back(letters)
        finally:
            await feed.close()


async def give_back(letters: list[Incoming]) -> None:
    """Return every letter not settled to its queue with `basic.nack`, in the order they were
    taken, before the channel closes (a closing channel's return counts as a failed delivery).
    A letter whose nack cannot be sent (the channel is gone) goes back with the channel."""
    for message in letters:
        if not message.processed:
            with contextlib.suppress(Exception):
                await message.nack(requeue=True)


async def dead_letters(connection: Connection, sources: list[str]) -> list[dict[str, Any]]:
    """Every dead letter of these input queues, described (they stay where they are)."""
    now = utcnow()
    rows: list[dict[str, Any]] = []

    async def add(source: str, message: Incoming) -> None:
        rows.append(describe(source, message, now))

    await _each(connection, sources, add)
    return rows


@dataclass(frozen=True)
class Found:
    """A dead letter in full: described, with its headers (as JSON holds them) and its body."""

    row: dict[str, Any]
    body: bytes


def as_asked(message_id: object, wanted: Collection[str]) -> str | None:
    """Which of the ids an operator asked for names this letter: its message id, or its id as
    every listing shows it (a card number in it masked by its stable mark), so that a letter
    listed under a masked id can be shown and replayed by it. None: not one of them."""
    if not isinstance(message_id, str):
        return None
    if message_id in wanted:
        return message_id
    shown = redact_shown(message_id)
    return shown if shown != message_id and shown in wanted else None


async def find(connection: Connection, sources: list[str], message_id: str) -> list[Found]:
    """The dead letters with this message id, or shown by it (a message may be in several
    DLQs)."""
    now = utcnow()
    found: list[Found] = []

    async def match(source: str, message: Incoming) -> None:
        if as_asked(message.message_id, (message_id,)) is not None:
            headers = {k: header_value(v) for k, v in (message.headers or {}).items()}
            found.append(Found(describe(source, message, now) | {"headers": headers}, message.body))

    await _each(connection, sources, match)
    return found


@dataclass
class Replayed:
    """What a replay did: the letters replayed, those left in place because they carry no seal
    of their consumer's, and the message ids asked for that no DLQ holds."""

    replayed: list[dict[str, Any]] = field(default_factory=list)
    unsealed: list[dict[str, Any]] = field(default_factory=list)
    not_found: list[str] = field(default_factory=list)


async def replay(
    connection: Connection,
    names: Names,
    sources: list[str],
    wanted: Collection[str] | None,
    *,
    by: str,
    senders: Senders,
    publish_timeout_s: float,
) -> Replayed:
    """Send the dead letters with these message ids (None: every one) back to their source
    queue, each removed from its DLQ once the broker confirmed its copy. `senders`: who the
    operator publishes as (only a consumer's own user may replay a letter without its seal)."""
    outcome = Replayed()
    publisher = await Publisher.open(connection, timeout=publish_timeout_s)
    asked_for: set[str] = set()

    async def one(source: str, message: Incoming) -> None:
        if wanted is not None:
            asked = as_asked(message.message_id, wanted)
            if asked is None:
                return
            asked_for.add(asked)
        ours = SEAL in (message.headers or {}) and broker_made(message) is None
        if senders.strict and not ours:
            # Under the operator's own user, a consumer takes only sealed dead letters (the
            # broker's own, and those from before seals, are refused): left in place.
            outcome.unsealed.append({"message_id": message.message_id, "queue": source})
            return
        # Back to the queue whose DLQ holds it, through its replay exchange (the operator's
        # only way into an input queue), never to the one a header names.
        await publisher.publish_raw(
            replayable(message, by), exchange=names.replay(source), routing_key=source
        )
        await message.ack()  # only once the broker confirmed the copy
        outcome.replayed.append({"message_id": message.message_id, "queue": source})

    try:
        await _each(connection, sources, one)
    finally:
        await publisher.close()
    outcome.not_found = sorted(set(wanted or ()) - asked_for)
    return outcome


def replayable(message: Incoming, by: str) -> Outgoing:
    """The copy a replay publishes."""
    # A replay starts afresh: of our headers only the sender and the seal its consumer put on
    # it (without which the consumer refuses it: shared/broker/seal.py), of the sender's only
    # those a copy carries; and every property the seal covers exactly as it was.
    original = dict(message.headers or {})
    headers = carried_headers(original)
    headers |= {k: original[k] for k in (SENDER, SEAL) if isinstance(original.get(k), str)}
    headers |= {REPLAYED_AT: utcnow().isoformat(), REPLAYED_BY: by}
    return Outgoing(
        message.body,
        headers=headers,
        message_id=message.message_id,
        correlation_id=message.correlation_id,
        reply_to=message.reply_to,
        type=message.type,
        content_type=message.content_type,
    )


async def purge(connection: Connection, sources: list[str]) -> dict[str, int]:
    """Delete every dead letter of these input queues for good: how many, per DLQ."""
    purged: dict[str, int] = {}
    admin = await connection.admin()
    try:
        for name in (Names.dlq(s) for s in sources):
            purged[name] = await admin.purge(name)
    finally:
        await admin.close()
    return purged
