"""The submission process: records each order from `<hub>.orders`, idempotently (DESIGN §4).

The order record and the state record are two insert-if-absent writes. A resubmission with the
same data is accepted as it is; different data under a known order id overwrites nothing: the
message is dead-lettered (`conflict`) and an alert raised. Those writes are this queue's dedupe:
a copy of an order's message (a redelivery, a publisher's retry, a replay) finds its order
recorded, adds nothing, and sends its `Received` status again, under the same message id, while
the order waits for its first claim; so the consumer claims no inbox entry for it
(decision:orders-deduped-by-order). While the outstanding backlog (Pending + Processing) is over the
threshold, submission
stops taking orders (admission control): they wait in `<hub>.orders`, which refuses publishers
once it is full.

The consumer binds each delivery's `message_id` and `order_id` to the lines written while it is
handled: the refused reply_to, the conflict (its alert and its dead-letter) and a pause that an
order tipped all name the order.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from datetime import datetime
from typing import Any

from opentelemetry.trace import SpanKind

from shared import metrics
from shared.bootstrap import Runtime
from shared.broker.consumer import Consumer, Delivery
from shared.broker.envelope import shown
from shared.broker.private import StatusBinder
from shared.broker.topology import APP_NAME
from shared.domain.journal import AlertKind, HistoryEventType, Severity
from shared.domain.messages import OrderStatus, SubmitOrder
from shared.domain.models import OrderData, OrderRecord, scoped
from shared.domain.states import ProcessState
from shared.domain.timing import utcnow
from shared.domain.workflow import current_workflow, new_state_record
from shared.errors import InvalidMessage, ServiceUnavailable, one_line
from shared.reporting import Reporter
from shared.store.port import InsertOutcome
from shared.tracing import order_span

log = logging.getLogger(__name__)

OUTSTANDING = frozenset({ProcessState.PENDING, ProcessState.PROCESSING})
RESUME_AT = 0.9
"""Resume taking orders once the backlog is back under this share of the threshold."""


class Submission:
    def __init__(self, runtime: Runtime) -> None:
        self._rt = runtime
        self._report: Reporter = runtime.reporter()
        self._threshold = runtime.settings.submission.backlog_threshold
        self._workflow = current_workflow("order", runtime.settings.workflow.workflow_version)
        self._names = runtime.names
        self._consumer: Consumer | None = None
        self._senders = runtime.senders("submission")
        self._binder = StatusBinder(runtime.connection, runtime.names)
        self._backlog = 0
        """The last count of outstanding orders, plus the orders recorded since."""
        metrics.BACKLOG_THRESHOLD.set(self._threshold)
        metrics.SUBMISSION_PAUSED.set(0)

    def _counted(self, backlog: int) -> None:
        """The backlog from now on, also as `orderflow_backlog` (what the alert rule on the
        admission threshold reads)."""
        self._backlog = backlog
        metrics.BACKLOG.set(backlog)

    @property
    def paused(self) -> bool:
        """Whether submission takes no orders: its consumer's own state, not a copy of it (a
        copy set after an await disagreed with it once pauses and resumes interleaved)."""
        return self._consumer is not None and self._consumer.paused

    def status(self) -> dict[str, Any]:
        """This process's part of its heartbeat."""
        return {"paused": self.paused, "backlog": self._backlog}

    async def handle(self, delivery: Delivery) -> None:
        message = delivery.message
        if not isinstance(message, SubmitOrder):
            raise InvalidMessage(
                "the orders queue takes order.submit messages only", reason="wrong-type"
            )
        now = utcnow()
        order = OrderRecord.of(self._owned(message, delivery.user_id), now)
        # The root span of the order's trace (shared/tracing.py), named by its system order id.
        with order_span(
            "record order",
            order.order_id,
            headers=delivery.headers,
            kind=SpanKind.CONSUMER,
            root=True,
            attributes={"messaging.message.id": delivery.message_id},
        ):
            await self._record(message, delivery, order, now)

    async def _record(
        self, message: SubmitOrder, delivery: Delivery, order: OrderRecord, now: datetime
    ) -> None:
        asked = message.reply_to or delivery.reply_to
        reply_to = self._names.accepted_status_queue(asked, delivery.user_id)
        if asked is not None and reply_to is None:
            log.warning(
                "reply_to refused: not a status queue of this hub and this application; "
                "the order is recorded without status messages",
                extra={"reply_to": shown(asked)},
            )
        if reply_to is not None:
            await self._binder.bind(reply_to)
        state = new_state_record(
            order,
            self._workflow,
            now=now,
            retry_budget=self._rt.settings.workflow.retry_budget,
            reply_to=reply_to,
        )
        # Its timeline's first event goes with the records, written only if the order is new.
        submitted = self._report.event(
            order.order_id,
            HistoryEventType.ORDER_SUBMITTED,
            message_id=delivery.message_id,
            reply_to=reply_to,
            fingerprint=order.fingerprint,
        )
        outcome = await self._rt.store.insert_order(order, state, history=[submitted])
        order_id = order.order_id
        if outcome is InsertOutcome.CONFLICT:
            await self._report.alert(
                AlertKind.DUAL_WRITE_CONFLICT,
                f"order {order_id} resubmitted with different data; the first order is kept",
                alert_id=f"conflict:{order_id}:{order.fingerprint[:16]}",
                order_id=order_id,
                message_id=delivery.message_id,
            )
            raise InvalidMessage(
                f"order {order_id} exists with different data; nothing was overwritten",
                reason="conflict",
            )
        if outcome is InsertOutcome.CREATED:
            self._counted(self._backlog + 1)
        else:
            # A copy of its message, or a resubmission: `insert_order` has put the state record
            # and its first event in place before it answered. (A majority read on MongoDB may
            # not see them yet: None, taken as not begun, and the Received goes again.)
            existing = await self._rt.store.get_state(order_id)
            begun = existing is not None and (
                existing.process_state is not ProcessState.PENDING or existing.attempt > 0
            )
            log.info(
                "order recorded already: a copy of its message, or a resubmission",
                extra={"run_begun": begun},
            )
            if begun:
                # A Received now could reach the application after the statuses that followed
                # the first one's.
                return
        await self._report.status(
            order_id,
            reply_to,
            OrderStatus.RECEIVED,
            ProcessState.PENDING,
            message_id=f"{order_id}:status:received",
        )
        # After the status: a pause that fails (the broker refusing the cancel, the store the
        # alert) has the message handled again, when the order may have been claimed already
        # and the copy would send no Received.
        if outcome is InsertOutcome.CREATED and self._backlog > self._threshold:
            await self._pause()

    def _owned(self, message: SubmitOrder, user: str | None) -> OrderData:
        """The order under its id in the system: where applications are told apart by their
        broker users, prefixed with the sending application's name, so that an order id can
        only conflict with another of the same application."""
        if not self._senders.strict:
            return message.order
        if user is None or not APP_NAME.fullmatch(user):
            raise InvalidMessage(
                f"the sending application's user {shown(user)} must match {APP_NAME.pattern}: "
                "it names the application's orders and status queues",
                reason="unauthorised",
            )
        return message.order.model_copy(update={"order_id": scoped(user, message.order.order_id)})

    async def close(self) -> None:
        await self._binder.close()

    async def attach(self, consumer: Consumer) -> None:
        self._consumer = consumer
        self._counted(await self._rt.store.count_in_states(OUTSTANDING))

    async def _pause(self) -> None:
        """Stop taking orders: at most the messages already in hand (the prefetch) follow.
        Pauses and resumes are serialised by the consumer; only the one that stopped the intake
        says so (several handlings over the threshold may ask at once)."""
        if self._consumer is None:
            return
        # A cancel the broker refuses (the connection is down) raises and leaves the consumer
        # subscribed: the next count pauses it.
        stopped = await self._consumer.pause()
        metrics.SUBMISSION_PAUSED.set(int(self.paused))
        if not stopped:
            return
        log.warning(
            "backlog over the threshold: submission paused",
            extra={"backlog": self._backlog, "threshold": self._threshold},
        )
        await self._report.alert(
            AlertKind.BACKLOG_OVER_THRESHOLD,
            f"backlog {self._backlog} over {self._threshold}: submission paused",
            alert_id=f"backlog:{utcnow().isoformat(timespec='seconds')}",
            severity=Severity.WARNING,
            backlog=self._backlog,
        )

    async def admit(self, consumer: Consumer) -> None:
        """One admission check: count the backlog; pause over the threshold, resume under 90%
        of it."""
        self._counted(await self._rt.store.count_in_states(OUTSTANDING))
        if self._backlog > self._threshold:
            await self._pause()
        elif self.paused and self._backlog <= self._threshold * RESUME_AT:
            resumed = await consumer.resume()
            metrics.SUBMISSION_PAUSED.set(int(self.paused))
            if resumed:
                log.info(
                    "backlog back under the threshold: submission resumed",
                    extra={"backlog": self._backlog, "threshold": self._threshold},
                )

    async def admission(self, consumer: Consumer, stop: asyncio.Event) -> None:
        """Check admission every interval (`admit`). Between counts, each recorded order adds
        to the estimate, so a burst pauses at once instead of at the next count."""
        while not stop.is_set():
            try:
                await self.admit(consumer)
            except ServiceUnavailable as exc:  # an outage: every check fails alike until it ends
                log.warning("admission check failed", extra={"error": one_line(exc)})
            except Exception:
                log.exception("admission check failed")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    stop.wait(), timeout=self._rt.settings.submission.backlog_check_s
                )


async def serve_submission(runtime: Runtime, stop: asyncio.Event, *, burst: bool = False) -> None:
    """Record orders until `stop`; in `burst` mode, until none is left to record."""
    submission = Submission(runtime)
    # The order's insert-if-absent is the dedupe, keyed by the order
    # (decision:orders-deduped-by-order): no inbox.
    consumer = await runtime.consumer(runtime.names.orders, submission.handle, dedupe=False)
    await submission.attach(consumer)
    async with runtime.heartbeat("submission", submission.status):
        await consumer.start()
        log.info("submission ready")
        if burst:
            runtime.burst(stop)
        try:
            await submission.admission(consumer, stop)
        finally:
            await consumer.stop(drain_timeout=runtime.settings.process.drain_timeout_s)
            await submission.close()
