"""`orderflow dlq list|show|replay|purge`: the dead-lettered messages of each input queue.

Reading never loses a message: the messages are fetched unacknowledged and go back to their
dead-letter queue when the command's channel closes, except those a replay or a purge removes.
A replay publishes the message, with its original `message_id`, to the queue it came from
(through that queue's replay exchange, the only way the operator's user has into it) and removes
it from the dead-letter queue only once the broker confirmed the publish; so dedupe still holds
(a message whose id was handled already is dropped as a duplicate, not handled twice). The
queue's consumer accepts a replay only with the seal it put on the dead letter, as the message of
its original sender; a message the broker dead-lettered on its own (its delivery limit) has no
seal, and its replay is refused (`unauthorised`) unless the operator runs as the consumer's
user.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import datetime
from typing import Any

import aio_pika
import click
from aio_pika.abc import AbstractChannel, AbstractIncomingMessage, AbstractRobustConnection
from rich.table import Table

from services.cli.render import add_columns, plain, plain_console, shorten_tokens, shown
from services.cli.settings import pass_settings
from shared.bootstrap import open_broker
from shared.broker.connection import login_user
from shared.broker.consumer import DEAD_LETTERED_AT, DELIVERIES, ERROR, REASON, SOURCE_QUEUE
from shared.broker.envelope import SEAL, SENDER, carried_headers
from shared.broker.publisher import Publisher
from shared.broker.senders import Senders
from shared.broker.topology import Names
from shared.config import Settings
from shared.domain.durations import human_age
from shared.domain.redaction import redact_body
from shared.domain.timing import utcnow
from shared.errors import BadInput

REPLAYED_AT = "x-orderflow-replayed-at"
REPLAYED_BY = "x-orderflow-replayed-by"
BODY_SHOWN = 4000


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


def _header_value(value: Any) -> Any:
    """A header as JSON can hold it: a value that is not text (bytes a sender wrote, which the
    broker kept) as its escaped text, so no listing fails on it."""
    if value is None or isinstance(value, str | int | float | bool):
        return value
    if isinstance(value, bytes | bytearray):
        return plain(bytes(value).decode("utf-8", "backslashreplace"))
    return plain(repr(value))


def broker_made(message: AbstractIncomingMessage) -> dict[str, Any] | None:
    """The broker's own record of dead-lettering this message (its `x-death` header), when the
    broker put it in the DLQ itself (its delivery limit, a message's TTL), not our consumer: the
    message is then as its sender wrote it, and its `x-orderflow-…` headers are the sender's."""
    deaths = (message.headers or {}).get("x-death")
    if not isinstance(deaths, list):
        return None
    first = deaths[0] if deaths and isinstance(deaths[0], dict) else {}
    at = first.get("time")
    shown = {k: _header_value(v) for k, v in first.items()}
    return shown | {"time": at if isinstance(at, datetime) else None}


def describe(source: str, message: AbstractIncomingMessage, now: datetime) -> dict[str, Any]:
    headers = {k: _header_value(v) for k, v in (message.headers or {}).items()}
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


@asynccontextmanager
async def _broker(settings: Settings) -> AsyncIterator[AbstractRobustConnection]:
    connection = await open_broker(settings, name="orderflow-dlq")
    try:
        yield connection
    finally:
        await connection.close()


async def _fetch(channel: AbstractChannel, source: str) -> list[AbstractIncomingMessage]:
    """Every message of the source queue's DLQ, unacknowledged (they return on channel close)."""
    queue = await channel.declare_queue(Names.dlq(source), passive=True)
    got: list[AbstractIncomingMessage] = []
    while (message := await queue.get(no_ack=False, fail=False)) is not None:
        got.append(message)
    return got


async def dead_letters(settings: Settings, sources: list[str]) -> list[dict[str, Any]]:
    """Every dead letter of these input queues, described (they stay where they are)."""
    now = utcnow()
    rows: list[dict[str, Any]] = []
    async with _broker(settings) as connection:
        for source in sources:
            channel = await connection.channel()
            try:
                rows += [describe(source, m, now) for m in await _fetch(channel, source)]
            finally:
                await channel.close()
    return rows


@click.group()
def dlq() -> None:
    """Dead-lettered messages per input queue: list, show, replay, purge."""


@dlq.command("list")
@click.option("--queue", help="One input queue (orders, payment, …); default all.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@pass_settings()
def list_cmd(settings: Settings, queue: str | None, as_json: bool) -> None:
    """Dead-lettered messages with their reasons (the messages stay where they are)."""
    sources = source_queues(Names(settings.hub), queue)
    rows = asyncio.run(dead_letters(settings, sources))
    if as_json:
        click.echo(json.dumps({"messages": rows}))
        return
    table = Table(title=f"{len(rows)} dead-lettered message(s) in hub {settings.hub}")
    add_columns(table, "queue", "message id", "type", "reason", "error", "dead-lettered")
    for r in rows:
        table.add_row(
            shown(r["queue"].removeprefix(f"{settings.hub}.")),
            shown(r["message_id"]),
            shown(r["type"]),
            shown(r["reason"]),
            shown(str(r["error"] or "")[:60]),
            r["age"],
        )
    plain_console().print(table)


@dlq.command("show")
@click.argument("message_id")
@click.option("--queue", help="One input queue (orders, payment, …); default all.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@pass_settings()
def show_cmd(settings: Settings, message_id: str, queue: str | None, as_json: bool) -> None:
    """One dead-lettered message: its reason, headers and body."""
    sources = source_queues(Names(settings.hub), queue)

    async def find() -> list[dict[str, Any]]:
        now = utcnow()
        found: list[dict[str, Any]] = []
        async with _broker(settings) as connection:
            for source in sources:
                channel = await connection.channel()
                try:
                    for m in await _fetch(channel, source):
                        if m.message_id == message_id:
                            row = describe(source, m, now)
                            row["headers"] = {
                                k: _header_value(v) for k, v in (m.headers or {}).items()
                            }
                            row["body"] = _body(m.body)
                            found.append(row)
                finally:
                    await channel.close()
        return found

    found = asyncio.run(find())
    if not found:
        raise BadInput(f"no dead-lettered message {message_id!r} in hub {settings.hub}")
    if as_json:
        click.echo(json.dumps({"messages": found}))
        return
    for row in found:
        click.echo(
            plain(f"{row['message_id']} on {row['queue']} ({row['type']}, {row['bytes']} bytes)")
        )
        click.echo(plain(f"  reason: {row['reason']}: {row['error']}"))
        click.echo(plain(f"  dead-lettered {row['age']} after {row['deliveries']} delivery(ies)"))
        # Its lines indented, so that no line of a body can pass for a line of this report.
        click.echo("  body: " + plain(row["body"], keep_lines=True).replace("\n", "\n    "))


def _body(body: bytes) -> str:
    """The body as text: pretty JSON (every control escaped by `json.dumps`; payment tokens
    shortened, as `orders show` does), or else decoded with replacement characters. Not
    escaped yet: JSON output must keep it as it is; the human view escapes it."""
    body = redact_body(body)[0]  # a message the broker dead-lettered itself is not redacted yet
    try:
        text = json.dumps(shorten_tokens(json.loads(body)), indent=2)
    except (ValueError, UnicodeDecodeError, RecursionError):
        text = body.decode("utf-8", errors="replace")
    return text if len(text) <= BODY_SHOWN else text[:BODY_SHOWN] + f"… ({len(text)} chars)"


@dlq.command("replay")
@click.argument("message_ids", nargs=-1)
@click.option("--all", "replay_all", is_flag=True, help="Every message of the queue(s).")
@click.option("--queue", help="One input queue (orders, payment, …); default all.")
@click.option("--by", default="operator", show_default=True, help="Recorded in a header.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@pass_settings()
def replay_cmd(
    settings: Settings,
    message_ids: tuple[str, ...],
    replay_all: bool,
    queue: str | None,
    by: str,
    as_json: bool,
) -> None:
    """Send dead-lettered messages back to their source queue, with their original message id."""
    if bool(message_ids) == replay_all:
        raise BadInput("name the messages to replay, or give --all")
    names = Names(settings.hub)
    sources = source_queues(names, queue)
    wanted = set(message_ids)

    # Under the operator's own user, a consumer takes only sealed dead letters (the broker's
    # own, and those from before seals, are refused): say so here, and leave them in place.
    senders = Senders.of(
        settings.hub, settings.broker_user_prefix, login_user(settings.rabbitmq_url), "operator"
    )
    unsealed: list[dict[str, Any]] = []

    async def replay() -> list[dict[str, Any]]:
        done: list[dict[str, Any]] = []
        async with _broker(settings) as connection:
            publisher = await Publisher.open(connection, timeout=settings.publish_timeout_s)
            try:
                for source in sources:
                    channel = await connection.channel()
                    try:
                        for m in await _fetch(channel, source):
                            if not (replay_all or m.message_id in wanted):
                                continue
                            ours = SEAL in (m.headers or {}) and broker_made(m) is None
                            if senders.strict and not ours:
                                unsealed.append({"message_id": m.message_id, "queue": source})
                                continue
                            # Back to the queue whose DLQ holds it, through its replay
                            # exchange (the operator's only way into an input queue), never
                            # to the one a header names.
                            await publisher.publish_raw(
                                _replayable(m, by),
                                exchange=names.replay(source),
                                routing_key=source,
                            )
                            await m.ack()  # only once the broker confirmed the copy
                            done.append({"message_id": m.message_id, "queue": source})
                    finally:
                        await channel.close()
            finally:
                await publisher.close()
        return done

    done = asyncio.run(replay())
    kept = {str(u["message_id"]) for u in unsealed}
    missing = sorted(wanted - {str(d["message_id"]) for d in done} - kept)
    _report_replay(done, unsealed, missing, as_json=as_json)
    if missing or unsealed:
        raise SystemExit(1)


def _report_replay(
    done: list[dict[str, Any]],
    unsealed: list[dict[str, Any]],
    missing: list[str],
    *,
    as_json: bool,
) -> None:
    if as_json:
        click.echo(json.dumps({"replayed": done, "not_found": missing, "unsealed": unsealed}))
    else:
        for d in done:
            click.echo(plain(f"{d['message_id']}: replayed to {d['queue']}"))
        for u in unsealed:
            click.echo(
                plain(
                    f"{u['message_id']}: not replayed, left in {u['queue']}.dlq: it has no seal "
                    "of its consumer's (the broker dead-lettered it, or an older release did), "
                    "and its consumer takes no unsealed message from the operator; resubmit it "
                    "from its sender"
                ),
                err=True,
            )
        for message_id in missing:
            click.echo(plain(f"{message_id}: not found in a dead-letter queue"), err=True)
        click.echo(f"{len(done)} replayed")


def _replayable(message: AbstractIncomingMessage, by: str) -> aio_pika.Message:
    # A replay starts afresh: of our headers only the sender and the seal its consumer put on
    # it (without which the consumer refuses it: shared/broker/seal.py), of the sender's only
    # those a copy carries; and every property the seal covers exactly as it was.
    original = dict(message.headers or {})
    headers = carried_headers(original)
    headers |= {k: original[k] for k in (SENDER, SEAL) if isinstance(original.get(k), str)}
    headers |= {REPLAYED_AT: utcnow().isoformat(), REPLAYED_BY: by}
    return aio_pika.Message(
        message.body,
        headers=headers,
        message_id=message.message_id,
        correlation_id=message.correlation_id,
        reply_to=message.reply_to,
        type=message.type,
        content_type=message.content_type,
        delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
    )


@dlq.command("purge")
@click.option("--queue", help="One input queue (orders, payment, …); default all.")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON: the messages deleted per DLQ.")
@pass_settings()
def purge_cmd(settings: Settings, queue: str | None, yes: bool, as_json: bool) -> None:
    """Delete dead-lettered messages for good (asks first, on stderr, unless --yes)."""
    sources = source_queues(Names(settings.hub), queue)
    dlqs = [Names.dlq(s) for s in sources]
    if not yes:
        # The question goes to stderr: stdout stays the report (JSON with --json).
        click.confirm(f"Delete every message in {', '.join(dlqs)} for good?", abort=True, err=True)

    async def purge() -> dict[str, int]:
        purged: dict[str, int] = {}
        async with _broker(settings) as connection:
            channel = await connection.channel()
            for name in dlqs:
                declared = await channel.declare_queue(name, passive=True)
                result = await declared.purge()
                purged[name] = int(result.message_count or 0)
            await channel.close()
        return purged

    purged = asyncio.run(purge())
    if as_json:
        click.echo(json.dumps({"purged": purged}))
        return
    for name, n in purged.items():
        click.echo(f"{name}: {n} message(s) deleted")
