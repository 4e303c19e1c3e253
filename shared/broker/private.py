"""A process's private queues (a scheduler's replies, an application's statuses), declaring and
binding an application's status queues for it, and matching replies to requests.

An application declares no queue (its broker user may not: one that declared a thousand filled
the virtual host, and a restarting scheduler could not declare its reply queue). It names a
status queue of its own in the orders it submits (`Names.status_queue`: a random name per
follower, so two runs of one application never share one), and submission declares and binds
it before the first order's `Received` status (`StatusBinder`): at most
`STATUS_QUEUES_PER_APP` of one application. The application consumes it once it exists
(`PrivateQueue`), and again after each reconnection; a queue that no one consumes, nor names in
an order, for `STATUS_QUEUE_EXPIRES_MS` is deleted by the broker.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from opentelemetry.trace import SpanKind

from shared.backoff import Backoff
from shared.broker.declarations import Difference, declare_as_it_is
from shared.broker.envelope import shown, user_of
from shared.broker.port import Connection, Feed, Incoming, QueueAdmin, QueueMissing
from shared.broker.senders import Senders
from shared.broker.topology import Names
from shared.domain.messages import Contract, StepAction, StepReply, decode
from shared.errors import ContractViolation, one_line
from shared.metrics import REPLIES_DROPPED
from shared.tracing import order_span

log = logging.getLogger(__name__)

Listener = Callable[[Contract, Incoming], None]

STATUS_QUEUE_EXPIRES_MS = 5 * 60 * 1000
"""A status queue nobody has consumed from, nor named in an order, for this long is deleted by
the broker: its follower finished or died. One that reconnects within it finds its queue, and
every status sent meanwhile, in place (the queue is not auto-delete, which would drop it, and
the statuses sent to it, the moment a connection is lost)."""
STATUS_QUEUE: dict[str, Any] = {"x-expires": STATUS_QUEUE_EXPIRES_MS}
"""The arguments submission declares an application's status queue with (durable, not
auto-delete: the only kind it binds)."""
TOLERATED = frozenset(
    {
        "durable",
        "auto_delete",
        "x-expires",
        "x-message-ttl",
        "x-max-length",
        "x-max-length-bytes",
        "x-overflow",
        "x-max-priority",
        "x-single-active-consumer",
        "x-queue-mode",
        "x-queue-version",
        "x-queue-type",
        "x-delivery-limit",
    }
)
"""The settings in which an application's own status queue may differ from what submission
declares and still be bound: each changes only how long the queue and its statuses last, or
how they are delivered to the application. Any other (dead-lettering above all: a queue that
dead-letters into `<hub>.submit` would loop our statuses into the orders queue), and another
connection's exclusive queue, is refused: the queue is not bound, and its orders go on without
statuses. Two are tolerated with some values only (`tolerated`): `x-overflow` drops the oldest
or nothing (`reject-publish` would nack our own publishes, so a queue nobody reads would turn
every status into an error on submission's, the schedulers' and the supervisor's channels), and
the queue's type is classic or quorum (a stream keeps every status until its retention)."""
TOLERATED_VALUES: dict[str, frozenset[Any]] = {
    "x-overflow": frozenset({None, "drop-head"}),
    "x-queue-type": frozenset({None, "classic", "quorum"}),
}


def tolerated(difference: Difference) -> bool:
    """Whether an application's status queue may differ from ours by `difference` and be bound."""
    allowed = TOLERATED_VALUES.get(difference.setting)
    if allowed is not None:
        return difference.current in allowed
    return difference.setting in TOLERATED


STATUS_QUEUES_PER_APP = 64
"""Status queues submission declares for one application, at most (those that still exist):
each follower (a run of `orderflow submit --wait`, an API process) has one, and a finished
one's goes `STATUS_QUEUE_EXPIRES_MS` after. Past them an order is recorded without statuses.
The generated definitions count them into the virtual host's queue limit
(deployment/rabbitmq.py)."""
BIND_TIMEOUT_S = 2.0
FOLLOW_PAUSE_CAP_S = 2.0
"""Longest pause between two looks for a status queue that submission has not declared yet."""


class PrivateQueue:
    """Replies are not precious: one lost is a deadline that passes, which the supervisor handles.
    So they are consumed without acks, and a bad one is logged and dropped, never requeued.

    A scheduler's reply queue is declared here, exclusive, and bound, with its own name as the
    routing key, to `<hub>.replies` (`Names.exchange_feeding`), so that who may send to it is a
    matter of permissions on that exchange, never of the default exchange. An application's
    status queue is declared and bound to `<hub>.status` by submission, for the first order
    that names it: `start` returns at once, and the queue is consumed once it exists
    (`attached`), and again after each reconnection."""

    def __init__(
        self,
        connection: Connection,
        name: str,
        listener: Listener,
        *,
        max_bytes: int,
        prefetch: int = 1000,
    ) -> None:
        self.name = name
        self._connection = connection
        self._listener = listener
        self._max_bytes = max_bytes
        self._prefetch = prefetch
        self._feed: Feed | None = None
        self._tag: str | None = None
        self._unsubscribe: Callable[[], None] | None = None
        feeding = Names.exchange_feeding(name)
        self._status = feeding is not None and feeding.endswith(".status")
        self._following: asyncio.Task[None] | None = None
        self._attached = asyncio.Event()
        self._stopped = False

    @property
    def attached(self) -> bool:
        """Whether the queue is being consumed (a status queue: once submission declared it)."""
        return self._attached.is_set()

    async def start(self) -> None:
        if self._status:
            self._following = asyncio.get_running_loop().create_task(self._follow())
            self._unsubscribe = self._connection.on_reconnect(self._reconnected)
            return
        self._feed = await self._connection.feed(prefetch=self._prefetch)
        await self._feed.own_queue(
            self.name, bind_to=Names.exchange_feeding(self.name), routing_key=self.name
        )
        self._tag = await self._feed.consume(self.name, self._on_message, ack=False)
        self._attached.set()

    async def _follow(self) -> None:
        """Consume the status queue once it exists. Consumed without the adapter's restore: a
        restore that fails (the queue expired while the connection was away) would retry the
        whole connection, its publisher's too, for ever; this looks again instead, until
        submission declares the queue anew."""
        pauses = Backoff(first=0.05, cap=FOLLOW_PAUSE_CAP_S)
        while not self._stopped:
            feed = None
            try:
                feed = await self._connection.feed(prefetch=self._prefetch)
                tag = await feed.consume(self.name, self._on_message, ack=False, restore=False)
            except Exception as exc:  # not declared yet, or the connection is away
                if not isinstance(exc, QueueMissing):
                    log.debug("status queue not followed yet", extra={"error": one_line(exc)})
                if feed is not None:
                    await _close_quietly(feed)
                await asyncio.sleep(pauses.next())
                continue
            self._feed, self._tag = feed, tag
            self._attached.set()
            return

    def _reconnected(self) -> None:
        """The connection is back without our consumer (see `_follow`): follow again."""
        if self._stopped or (self._following is not None and not self._following.done()):
            return
        self._attached.clear()
        previous, self._feed, self._tag = self._feed, None, None
        if previous is not None:
            asyncio.get_running_loop().create_task(_close_quietly(previous))
        self._following = asyncio.get_running_loop().create_task(self._follow())

    async def stop(self) -> None:
        self._stopped = True
        if self._unsubscribe is not None:
            self._unsubscribe()
        if self._following is not None:
            self._following.cancel()
            await asyncio.gather(self._following, return_exceptions=True)
        if self._feed is not None and self._tag is not None:
            with contextlib.suppress(Exception):
                await self._feed.cancel(self._tag)
        if self._feed is not None:
            await _close_quietly(self._feed)

    async def _on_message(self, message: Incoming) -> None:
        try:
            contract = decode(message.type, message.body, max_bytes=self._max_bytes)
        except ContractViolation as exc:
            log.warning("dropping a bad reply", extra={"reason": exc.reason, "error": str(exc)})
            return
        try:
            self._listener(contract, message)
        except Exception:
            log.exception("reply listener failed")


async def _close_quietly(channel: Feed | QueueAdmin) -> None:
    with contextlib.suppress(Exception):
        await channel.close()


@dataclass(frozen=True)
class Expected:
    """What the reply to one step request must be: from that step's agent, about that step,
    action, attempt (fencing token) and idempotency key."""

    sender_role: str
    order_id: str
    step: str
    action: StepAction
    fencing_token: str
    idempotency_key: str

    def mismatch(self, reply: Contract) -> str | None:
        """What of the reply does not answer the request, or None."""
        if not isinstance(reply, StepReply):
            return "not-a-reply"
        for name in ("order_id", "step", "action", "fencing_token", "idempotency_key"):
            if getattr(reply, name) != getattr(self, name):
                return "mismatch"
        return None


class StatusBinder:
    """Declares an application's status queue and binds it to `<hub>.status`, on its behalf: an
    application declares no queue and reads no exchange (shared/broker/access.py). Called by
    submission for the `reply_to` of each order it takes, once it is sure the queue is the
    sending application's own, before the order's first status.

    At most `per_app` queues of one application (of those this process declared, the ones that
    still exist): a new one past them is refused, so no application can fill the virtual host.
    A queue is declared and bound again at most every `every_s` (which also keeps it from
    expiring while orders name it). A queue the application made itself with other settings is
    bound as it is when they differ only in `TOLERATED` ones (learned from the broker's
    refusals: shared/broker/declarations.py), and the difference logged once; otherwise it is
    not bound. Never raises: an order is recorded whether or not its statuses can be
    delivered."""

    def __init__(
        self,
        connection: Connection,
        names: Names,
        *,
        every_s: float = 60.0,
        per_app: int = STATUS_QUEUES_PER_APP,
        max_known: int = 10_000,
    ) -> None:
        self._connection = connection
        self._names = names
        self._every_s = every_s
        self._per_app = per_app
        self._max_known = max_known
        self._declared: dict[str, dict[str, float]] = {}
        """Application -> its status queues this process declared -> when, last."""
        self._counted: dict[str, float] = {}
        """Application -> when its declared queues were last looked for (`_room`)."""
        self._failed: dict[str, float] = {}
        self._admin: QueueAdmin | None = None
        self._lock = asyncio.Lock()

    async def bind(self, queue: str) -> bool:
        now = asyncio.get_running_loop().time()
        app = self._names.status_app(queue)
        declared = self._declared.setdefault(app, {})
        at = declared.get(queue)
        if at is not None and now - at < self._every_s:
            return True
        failed = self._failed.get(queue)
        if failed is not None and now - failed < self._every_s:
            return False  # tried lately: a client naming queues it cannot have costs once
        async with self._lock:  # a declaration that fails closes its channel: one at a time
            if queue not in declared and not await self._room(app, declared):
                log.warning(
                    "an application has as many status queues as it may: this order's "
                    "statuses are not sent",
                    extra={"reply_to": shown(queue), "limit": self._per_app},
                )
                return self._failing(queue, now)
            try:
                async with asyncio.timeout(BIND_TIMEOUT_S):
                    admin = await self._admin_channel()
                    # Declared as a status queue is, or as the application made it where it
                    # differs only in `TOLERATED` settings; one with any other (dead-lettering
                    # our messages into the orders queue, say), or another connection's
                    # exclusive one, is refused before it is bound.
                    differences = await declare_as_it_is(
                        admin,
                        queue,
                        arguments=STATUS_QUEUE,
                        accept=tolerated,
                    )
                    await admin.bind(queue, self._names.status, routing_key=queue)
            except Exception as exc:  # another's queue, one we refuse, or the broker away
                log.warning(
                    "could not declare a status queue; the order's statuses are not sent",
                    extra={"reply_to": shown(queue), "error": one_line(exc, 300)},
                )
                return self._failing(queue, now)
        if differences and queue not in declared:
            log.warning(
                "a status queue exists with other settings than submission declares; "
                "bound as it is",
                extra={
                    "reply_to": shown(queue),
                    "differences": "; ".join(str(d) for d in differences),
                },
            )
        declared[queue] = now
        return True

    async def _room(self, app: str, declared: dict[str, float]) -> bool:
        """Whether `app` may have one more status queue: those of its queues that expired
        since are forgotten, looked for at most every `every_s` (a client naming new queues
        past its limit costs one look a minute, not one per order)."""
        if len(declared) < self._per_app:
            return True
        now = asyncio.get_running_loop().time()
        if now - self._counted.get(app, -self._every_s) < self._every_s:
            return False
        self._counted[app] = now
        for queue in list(declared):
            if not await self._exists(queue):
                del declared[queue]
        return len(declared) < self._per_app

    async def _exists(self, queue: str) -> bool:
        try:
            async with asyncio.timeout(BIND_TIMEOUT_S):
                await (await self._admin_channel()).depth(queue)
        except QueueMissing:
            return False
        except Exception:  # the broker away: count it, rather than declare one too many
            return True
        return True

    async def _admin_channel(self) -> QueueAdmin:
        if self._admin is None:
            self._admin = await self._connection.admin()
        return self._admin

    def _failing(self, queue: str, now: float) -> bool:
        if len(self._failed) >= self._max_known:
            self._failed.clear()
        self._failed[queue] = now
        return False

    async def close(self) -> None:
        if self._admin is not None:
            await _close_quietly(self._admin)


class ReplyRouter:
    """Matches replies to the requests waiting for them: by correlation id (random per request,
    so not guessed), then by sender (the broker-checked user of the step's agent) and content
    (the request's step, action, fencing token and idempotency key). A reply that fails any of
    these is dropped and counted (`orderflow_replies_dropped_total`), and the request goes on
    waiting for its own reply, or its deadline."""

    def __init__(self, senders: Senders | None = None) -> None:
        self._waiting: dict[str, tuple[Expected | None, asyncio.Future[Contract]]] = {}
        self._senders = senders

    def expect(
        self, correlation_id: str, expected: Expected | None = None
    ) -> asyncio.Future[Contract]:
        future: asyncio.Future[Contract] = asyncio.get_running_loop().create_future()
        self._waiting[correlation_id] = (expected, future)
        return future

    def forget(self, correlation_id: str) -> None:
        self._waiting.pop(correlation_id, None)

    def deliver(self, contract: Contract, message: Incoming) -> None:
        waiting = self._waiting.get(message.correlation_id or "")
        if waiting is None or waiting[1].done():
            REPLIES_DROPPED.labels("unknown").inc()
            log.info(
                "late or unknown reply ignored",
                extra={"correlation_id": shown(message.correlation_id)},
            )
            return
        expected, future = waiting
        if expected is not None:
            why = self._refusal(expected, contract, message)
            if why is not None:
                reason, error = why
                REPLIES_DROPPED.labels(reason).inc()
                log.warning(
                    "reply dropped: it does not answer its request",
                    extra={"reason": reason, "error": error, "order_id": expected.order_id},
                )
                return
            # The reply's arrival, in its order's trace under the agent's publish of it.
            with order_span(
                f"receive {contract.message_type.value}",
                expected.order_id,
                headers=message.headers,
                kind=SpanKind.CONSUMER,
                attributes={"orderflow.step": expected.step},
            ):
                pass
        future.set_result(contract)

    def _refusal(
        self, expected: Expected, contract: Contract, message: Incoming
    ) -> tuple[str, str] | None:
        user = user_of(message)
        if self._senders is not None:
            unauthorised = self._senders.refusal(user, {expected.sender_role})
            if unauthorised is not None:
                return "unauthorised", unauthorised
        mismatch = expected.mismatch(contract)
        if mismatch is not None:
            return mismatch, f"a {contract.message_type.value} that does not match its request"
        return None
