"""The notifier process: takes each notification of `<hub>.alerts.feed` and delivers its alert
to every target (services/notifier/sending.py), and tells the targets of every alert an
operator acknowledged or resolved since (`orderflow alerts ack|resolve` record it in the store;
the notifier reads the changes every `ORDERFLOW_NOTIFY_POLL_S`).

A notification is acknowledged on the feed only once every target took its alert, had it
already, or had it dead-lettered: a notifier that stops or dies before that leaves it on the
queue, and the next notifier delivers it (to the targets that did not have it yet). A feed
message that is no alert of ours is dead-lettered with why, and acknowledged.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from datetime import timedelta
from typing import Any

import aiohttp

from services.notifier.formats import Notice, notices_of, webhook_body
from services.notifier.sending import Outcome, Sender, deliver_all
from services.notifier.targets import Target, targets_of
from services.operator.alerts import read_notification
from shared.backoff import Backoff
from shared.bootstrap import Runtime
from shared.broker.envelope import (
    DEAD_LETTERED_AT,
    ERROR,
    ERROR_LIMIT,
    REASON,
    SOURCE_QUEUE,
    TARGET,
)
from shared.broker.port import Feed, Incoming, Outgoing
from shared.broker.senders import Senders
from shared.broker.topology import existing_queue
from shared.broker.urls import login_user
from shared.config import NotifierSettings
from shared.domain.journal import Alert, AlertState
from shared.domain.redaction import redact_shown
from shared.domain.text import cut
from shared.domain.timing import utcnow
from shared.errors import ConfigurationError, one_line
from shared.telemetry import log_fields

log = logging.getLogger(__name__)

WATCH_BATCH = 500
"""Alert changes one read takes at most (a look pages through them all, oldest first)."""
TOLD_KEPT = 100_000
"""Notices this process remembers having finished, to skip them without asking the store."""


class Notifier:
    def __init__(self, runtime: Runtime, targets: list[Target], session: aiohttp.ClientSession):
        self._rt = runtime
        self._targets = targets
        settings = runtime.settings
        self._sender = Sender(
            settings.notifier,
            settings.hub,
            settings.broker.inbox_ttl_s,
            session,
            runtime.store,
            runtime.name,
            self._dead_letter,
        )
        self._senders = Senders.of(
            runtime.settings.hub,
            runtime.settings.broker.broker_user_prefix,
            login_user(runtime.settings.broker.rabbitmq_url),
            "notifier",
        )
        self._told: set[str] = set()
        self._handling: set[asyncio.Task[None]] = set()
        self._backoff = Backoff(first=0.5, cap=10.0)
        self.counts: dict[str, int] = {o.value: 0 for o in Outcome}

    def status(self) -> dict[str, Any]:
        """This notifier's part of its heartbeat."""
        return {"targets": [t.name for t in self._targets], "notices": dict(self.counts)}

    # -- the feed
    async def run(self, stop: asyncio.Event, *, burst: bool = False) -> None:
        names = self._rt.names
        await existing_queue(self._rt.connection, names.alert_feed)
        channel = await self._rt.connection.feed(prefetch=self._rt.settings.broker.prefetch)
        if burst:
            try:
                while (message := await channel.get(names.alert_feed)) is not None:
                    await self._handle(message, stop)
            finally:
                await channel.close()
            await self.tell_changes()
            return
        watcher = asyncio.create_task(self._watch(stop))
        try:
            await self._consume(channel, names.alert_feed, stop)
        finally:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
            with contextlib.suppress(Exception):
                await channel.close()

    async def _consume(self, channel: Feed, queue: str, stop: asyncio.Event) -> None:
        async def take(message: Incoming) -> None:
            task = asyncio.create_task(self._handle(message, stop))
            self._handling.add(task)
            task.add_done_callback(self._handling.discard)

        tag = await channel.consume(queue, take)
        try:
            await stop.wait()
        finally:
            # Drain: take no more, give those in hand a while, then leave the rest unacknowledged
            # (they go back to the queue when the channel closes).
            with contextlib.suppress(Exception):
                await channel.cancel(tag)
            if self._handling:
                _, late = await asyncio.wait(
                    set(self._handling), timeout=self._rt.settings.process.drain_timeout_s
                )
                for task in late:
                    task.cancel()
                await asyncio.gather(*late, return_exceptions=True)

    async def _handle(self, message: Incoming, stop: asyncio.Event) -> None:
        """One notification, whatever happens: acknowledged once finished with, else put back
        (never left unacknowledged, which would hold a prefetch slot until the channel closed)."""
        try:
            await self._handle_one(message, stop)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            # An acknowledgement lost with its channel, or a bug: the notification comes again
            # (redelivered, it finds what was sent marked, and is acknowledged then).
            log.exception("notification not finished", extra={"error": one_line(exc)})
            with contextlib.suppress(Exception):
                await message.nack(requeue=True)

    async def _handle_one(self, message: Incoming, stop: asyncio.Event) -> None:
        settings = self._rt.settings
        read = read_notification(message, self._senders, settings.broker.max_message_bytes)
        if isinstance(read, str):
            log.warning("feed message dead-lettered", extra={"reason": read})
            try:
                await self._set_aside(message.body, message.message_id, "invalid", read, None)
            except Exception as exc:
                await self._later(message, stop, f"not dead-lettered: {one_line(exc)}")
                return
            await message.ack()
            return
        notice = Notice(settings.hub, read)
        with log_fields(alert_id=read.alert_id, order_id=read.order_id):
            try:
                outcomes = await deliver_all(self._sender, self._targets, notice)
            except Exception as exc:
                await self._later(message, stop, one_line(exc))
                return
            if Outcome.BUSY in outcomes:
                await self._later(message, stop, "another notifier is delivering it")
                return
            self._finished(notice, outcomes)
            self._backoff.reset()
            await message.ack()

    async def _later(self, message: Incoming, stop: asyncio.Event, why: str) -> None:
        """Put the notification back on the feed after a pause (what was delivered of it is
        marked, and not sent again)."""
        pause = self._backoff.next()
        log.warning("notification put back", extra={"error": why, "pause_s": round(pause, 2)})
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), pause)
        with contextlib.suppress(Exception):
            await message.nack(requeue=True)

    def _finished(self, notice: Notice, outcomes: list[Outcome]) -> None:
        for target, outcome in zip(self._targets, outcomes, strict=True):
            self.counts[outcome.value] += 1
            if len(self._told) >= TOLD_KEPT:
                self._told.clear()
            self._told.add(f"{target.name}/{notice.key}")

    # -- acknowledgements and resolutions
    async def _watch(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await self.tell_changes()
            except Exception as exc:
                log.warning("alert changes not read", extra={"error": one_line(exc)})
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self._rt.settings.notifier.notify_poll_s)

    async def tell_changes(self) -> int:
        """Tell the targets of the alerts acknowledged or resolved lately (within half the
        inbox's window, so that each one is still remembered as sent when it is looked at
        again); how many notices were delivered or set aside now."""
        window = timedelta(seconds=self._rt.settings.broker.inbox_ttl_s / 2)
        since, after = utcnow() - window, None
        told = 0
        while True:
            page = await self._rt.store.changed_alerts(since=since, limit=WATCH_BATCH, after=after)
            told += await self._tell(page)
            if len(page) < WATCH_BATCH:
                return told
            last_alert, last_state = page[-1]
            since, after = last_state.changed_at or since, last_alert.alert_id

    async def _tell(self, changed: list[tuple[Alert, AlertState]]) -> int:
        told = 0
        for alert, state in changed:
            for notice in notices_of(self._rt.settings.hub, alert, state):
                targets = [t for t in self._targets if f"{t.name}/{notice.key}" not in self._told]
                if not targets:
                    continue
                outcomes = await deliver_all(self._sender, targets, notice)
                for target, outcome in zip(targets, outcomes, strict=True):
                    if outcome is not Outcome.BUSY:
                        self.counts[outcome.value] += 1
                        self._told.add(f"{target.name}/{notice.key}")
                        told += outcome is not Outcome.DUPLICATE
        return told

    # -- dead letters
    async def _dead_letter(self, target: Target, notice: Notice, reason: str, error: str) -> None:
        log.error(
            "notice dead-lettered",
            extra={"target": target.name, "reason": reason, "error": cut(redact_shown(error), 300)},
        )
        # The generic body, whatever the target's kind: it carries no secret (a PagerDuty
        # event would carry the routing key).
        body = json.dumps(webhook_body(notice)).encode()
        await self._set_aside(body, f"{notice.key}/{target.name}", reason, error, target)

    async def _set_aside(
        self, body: bytes, message_id: str | None, reason: str, error: str, target: Target | None
    ) -> None:
        names = self._rt.names
        headers: dict[str, Any] = {
            REASON: reason,
            ERROR: error[:ERROR_LIMIT],
            SOURCE_QUEUE: names.alert_feed,
            DEAD_LETTERED_AT: utcnow().isoformat(),
        }
        if target is not None:
            headers[TARGET] = target.name
        message = Outgoing(
            body,
            message_id=message_id,
            type="alert.notice" if target is not None else None,
            content_type="application/json" if target is not None else None,
            headers=headers,
        )
        await self._rt.publisher.publish_raw(
            message, exchange=names.alert_dead_letters, routing_key=""
        )


def required_targets(settings: NotifierSettings) -> list[Target]:
    """The configured targets; none is a configuration error (checked before connecting)."""
    targets = targets_of(settings)
    if not targets:
        raise ConfigurationError(
            "no notification target: set ORDERFLOW_NOTIFY_WEBHOOK_URL, ORDERFLOW_NOTIFY_SLACK_URL "
            "or ORDERFLOW_NOTIFY_PAGERDUTY_ROUTING_KEY"
        )
    return targets


async def serve_notifier(runtime: Runtime, stop: asyncio.Event, *, burst: bool = False) -> None:
    targets = required_targets(runtime.settings.notifier)
    log.info("delivering alerts", extra={"targets": [t.shown for t in targets]})
    async with aiohttp.ClientSession() as session:
        notifier = Notifier(runtime, targets, session)
        async with runtime.heartbeat("notifier", notifier.status):
            await notifier.run(stop, burst=burst)
