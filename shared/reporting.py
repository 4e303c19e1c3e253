"""What processes tell others: the history timeline, alerts, and status messages."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any, Protocol

from shared import clock
from shared.broker.publisher import Publishing
from shared.broker.topology import Names
from shared.domain.journal import Alert, AlertKind, HistoryEvent, HistoryEventType, Severity
from shared.domain.messages import AlertMessage, OrderStatus, OrderStatusUpdate
from shared.domain.models import StateRecord, unscoped
from shared.domain.states import ProcessState
from shared.domain.timing import utcnow
from shared.errors import PublishError, PublishUnroutable
from shared.store.port import Alerts, Journal

log = logging.getLogger(__name__)


class Reports(Journal, Alerts, Protocol):
    """The parts of the store a reporter writes to: the timeline and the alerts."""


class Reporter:
    def __init__(self, store: Reports, publisher: Publishing, names: Names, source: str) -> None:
        self._store = store
        self._publisher = publisher
        self._names = names
        self._source = source

    @property
    def source(self) -> str:
        """The process that reports."""
        return self._source

    def event(
        self,
        order_id: str,
        type_: HistoryEventType,
        *,
        attempt: int | None = None,
        instance_id: str | None = None,
        step: str | None = None,
        **data: Any,
    ) -> HistoryEvent:
        """A history event by this process, to append now or to carry with a state update."""
        return HistoryEvent(
            order_id=order_id,
            type=type_,
            at=utcnow(),
            attempt=attempt,
            instance_id=instance_id,
            step=step,
            data={"by": self._source, **data},
        )

    async def history(
        self,
        order_id: str,
        type_: HistoryEventType,
        *,
        attempt: int | None = None,
        instance_id: str | None = None,
        step: str | None = None,
        **data: Any,
    ) -> None:
        event = self.event(
            order_id, type_, attempt=attempt, instance_id=instance_id, step=step, **data
        )
        await self._store.append_history(event)

    async def alert(
        self,
        kind: AlertKind,
        message: str,
        *,
        alert_id: str,
        severity: Severity = Severity.CRITICAL,
        order_id: str | None = None,
        **data: Any,
    ) -> None:
        """Store the alert (idempotent by id) and publish it on `<hub>.alerts`. Its id and
        message are masked as it is made (shared/domain/journal.py `Alert`): a message id or
        an error may quote a card number; the id alike every time (a stable mark), so it stays
        the key. (Its data, the system's own values, is masked where it is shown.)"""
        alert = Alert(
            alert_id=alert_id,
            kind=kind,
            severity=severity,
            message=message,  # cut by `Alert` once masked (a cut first could halve a card)
            at=utcnow(),
            order_id=order_id,
            source=self._source,
            data=data,
        )
        fields = {"alert": kind.value, "detail": alert.message[:200]}
        log.warning(
            "alert raised",
            extra=fields if alert.order_id is None else fields | {"order_id": alert.order_id},
        )
        if not await self._store.raise_alert(alert):
            return
        try:
            await self._publisher.publish(
                AlertMessage(alert=alert),
                exchange=self._names.alerts,
                routing_key="",
                message_id=f"alert:{alert_id}",
            )
        except PublishError:
            # The stored alert is the record; the published copy is a notification.
            log.exception("could not publish an alert", extra={"alert_id": alert_id})

    async def failed(
        self, before: StateRecord, state: ProcessState, detail: str, *, why: str = "failed"
    ) -> None:
        """The Failed status of the attempt `before` ended with the order in `state`; one per
        attempt (and `why`), whoever parks the order, so a repeat is a duplicate."""
        await self.status(
            before.order_id,
            before.reply_to,
            OrderStatus.FAILED,
            state,
            message_id=f"{before.order_id}:status:{why}:{before.attempt}",
            detail=detail,
        )

    async def status(
        self,
        order_id: str,
        reply_to: str | None,
        status: OrderStatus,
        state: ProcessState,
        *,
        message_id: str,
        detail: str | None = None,
    ) -> None:
        """Tell the submitting application, if it asked; a vanished reply queue is not an error."""
        if not reply_to:
            return
        update = OrderStatusUpdate(
            order_id=unscoped(order_id),  # the application's own id
            status=status,
            process_state=state,
            at=utcnow(),
            detail=detail or None,  # cut by the contract once masked
        )
        try:
            await self._publisher.publish(
                update,
                exchange=self._names.status,
                routing_key=reply_to,
                message_id=message_id,
                correlation_id=order_id,
            )
        except PublishUnroutable:
            log.info("status reply queue is gone", extra={"order_id": order_id})
        except PublishError:
            log.exception("could not publish a status", extra={"order_id": order_id})


class PoisonAlerts:
    """The `poison-message` alerts of one input queue: the first dead letter of each reason
    raises one at once; the next ones within `window_s` are counted, and when the window ends
    one alert says how many there were (and a new window begins, so a steady stream raises
    one alert a window). A burst of refused messages (a broken or a hostile client) is then a
    handful of alerts, not one per message (each a store write and a publish: 22% of
    submission's CPU in a burst of 1,000): `orderflow dlq list` holds them all, and
    `orderflow_dead_letters_total` counts them."""

    def __init__(
        self,
        reporter: Reporter,
        queue: str,
        *,
        window_s: float,
        clock: Callable[[], float] = clock.monotonic,
    ) -> None:
        self._reporter = reporter
        self._queue = queue
        self._window_s = window_s
        self._clock = clock
        self._opened: dict[str, float] = {}
        """When each reason's window opened."""
        self._held: dict[str, list[str]] = {}
        """Per reason, the message ids dead-lettered in its window after its alert."""
        self._flushers: set[asyncio.Task[None]] = set()

    async def __call__(self, reason: str, error: str, message_id: str) -> None:
        if reason == "conflict":
            return  # the handler raised its own, more specific alert
        opened = self._opened.get(reason)
        if opened is not None and self._clock() - opened < self._window_s:
            held = self._held.setdefault(reason, [])
            held.append(message_id)
            if len(held) == 1:
                self._flush_later(reason, opened + self._window_s - self._clock())
            return
        self._opened[reason] = self._clock()
        await self._alert(
            reason,
            message_id,
            f"message {message_id} on {self._queue} dead-lettered ({reason}): {error}",
            more=0,
        )

    def _flush_later(self, reason: str, delay: float) -> None:
        task = asyncio.get_running_loop().create_task(self._flush(reason, max(0.0, delay)))
        self._flushers.add(task)
        task.add_done_callback(self._flushers.discard)

    async def _flush(self, reason: str, delay: float) -> None:
        await asyncio.sleep(delay)
        held = self._held.pop(reason, [])
        if not held:
            return
        self._opened[reason] = self._clock()  # the next ones are counted into the next window
        try:
            await self._alert(
                reason,
                held[-1],
                f"{len(held)} more messages on {self._queue} dead-lettered ({reason}) within "
                f"{self._window_s:.0f} s of the last alert, the last {held[-1]}",
                more=len(held),
            )
        except Exception:
            log.exception("could not raise a poison-message alert")

    async def _alert(self, reason: str, message_id: str, text: str, *, more: int) -> None:
        await self._reporter.alert(
            AlertKind.POISON_MESSAGE,
            text,
            alert_id=f"poison:{self._queue}:{message_id}:{reason}",
            severity=Severity.WARNING,
            queue=self._queue,
            reason=reason,
            more=more,
        )
