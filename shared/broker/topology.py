"""Queue and exchange names per task hub, their arguments, and declaring them (DESIGN §5)."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from shared.broker.port import Connection, ExchangeKind, QueueAdmin, QueueMismatch, QueueMissing
from shared.domain.workflow import AGENTS
from shared.errors import ConfigurationError

QUORUM_SINCE = (3, 10)
"""The first RabbitMQ release with what orderflow needs of quorum queues: delivery counts
(3.8), message TTL and at-least-once dead-lettering (3.10, for the retry queues)."""

APP_NAME = re.compile(r"[a-z][a-z0-9_-]{0,39}")
"""A submitting application's name: it prefixes its status queues, so no dots."""
STATUS_TAG = re.compile(r"[A-Za-z0-9_-]{1,64}")
"""The last part of a status queue's name: no dots, so no other routing key can hide in it."""


@dataclass(frozen=True)
class Names:
    """Every queue and exchange name of one task hub: all start with `<hub>.`."""

    hub: str

    @property
    def exchange(self) -> str:
        """Direct exchange for agent requests and operator replays (routing key = queue name)."""
        return f"{self.hub}.direct"

    @property
    def submit(self) -> str:
        """Fanout exchange bound only to `<hub>.orders`: what submitting applications publish to.

        Write permission on an exchange cannot be limited by routing key, so an application
        allowed to write to the direct exchange could send agent requests; on this one it can
        only submit orders."""
        return f"{self.hub}.submit"

    @property
    def replies(self) -> str:
        """Topic exchange carrying agent replies to schedulers' reply queues (routing key = queue
        name). Replies do not go through the default exchange: write permission on that one
        would let an agent publish into any queue of the vhost."""
        return f"{self.hub}.replies"

    @property
    def status(self) -> str:
        """Topic exchange carrying order status messages to submitting applications' status
        queues (routing key = queue name); topic permissions limit each application's
        bindings to its own queues' names."""
        return f"{self.hub}.status"

    @property
    def dead_letters(self) -> str:
        """Direct exchange the broker dead-letters an input queue's messages to on its own (its
        delivery limit; routing key = source queue name). Nobody may publish to it: a consumer
        dead-letters through its own queue's exchange (`dlq`)."""
        return f"{self.hub}.dlx"

    @property
    def alerts(self) -> str:
        """Fanout exchange every alert is published on (bound to `alert_feed`). Releases before
        issue 14 also had an unbounded queue of this name, which `orderflow init` deletes."""
        return f"{self.hub}.alerts"

    @property
    def alert_feed(self) -> str:
        """The durable queue bound to `alerts` that keeps the newest notifications for their
        reader, `orderflow alerts follow` (`x-max-length`). Not named like the exchange: read
        permission on a name covers a queue and an exchange alike, and read on the exchange
        would let the reader bind it to what it may write (the operator: replay exchanges)."""
        return f"{self.hub}.alerts.feed"

    @property
    def alert_dead_letters(self) -> str:
        """The queue, and the fanout exchange bound only to it, where the notifier sets aside a
        notice a target refused for good (or that failed until the notifier gave up), and a
        feed message that is no alert, each with its reason (only the notifier may write it)."""
        return self.dlq(self.alert_feed)

    @property
    def orders(self) -> str:
        return f"{self.hub}.orders"

    def agent(self, name: str) -> str:
        return f"{self.hub}.agent.{name}"

    @staticmethod
    def dlq(queue: str) -> str:
        """The dead-letter queue of an input queue, and the fanout exchange bound only to it,
        which only that queue's consumer may publish to: so what a DLQ holds was put there by
        its own consumer or by the broker, never by another process."""
        return f"{queue}.dlq"

    @staticmethod
    def replay(queue: str) -> str:
        """The fanout exchange bound only to `queue`, which the operator publishes replays to
        (it reaches no other queue, and its consumer accepts only sealed dead letters from it:
        shared/broker/seal.py)."""
        return f"{queue}.replay"

    @staticmethod
    def retry(queue: str) -> str:
        """The retry queue of an input queue, and the fanout exchange bound only to it: a
        message set aside waits there for its delay, then the broker dead-letters it back to
        `queue` (through the direct exchange). Only `queue`'s consumer may write to it, and it
        leads nowhere else, so it cannot carry a message into another process's queue."""
        return f"{queue}.retry"

    def reply_queue(self, process: str) -> str:
        """A private, per-process reply queue: it dies with its process, and so do late replies."""
        return f"{self.hub}.reply.{process}.{uuid.uuid4().hex[:12]}"

    def status_prefix(self, app: str) -> str:
        """What every status queue of the submitting application `app` starts with."""
        if not APP_NAME.fullmatch(app):
            raise ValueError(
                f"application name {app!r} must match {APP_NAME.pattern} (it names its queues)"
            )
        return f"{self.hub}.status.{app}."

    def status_queue(self, app: str) -> str:
        """A private status queue of the submitting application `app`, a new one each time (so
        two followers never share one): named with the app's prefix, which is all its RabbitMQ
        user may read. Submission declares it for the first order that names it
        (shared/broker/private.py)."""
        return f"{self.status_prefix(app)}{uuid.uuid4().hex[:12]}"

    def status_app(self, queue: str) -> str:
        """The application a status queue of this hub belongs to (its name's third part)."""
        return queue.removeprefix(f"{self.hub}.status.").partition(".")[0]

    def accepted_status_queue(self, reply_to: str | None, user_id: str | None) -> str | None:
        """`reply_to` if statuses may be sent to it, else None. Statuses travel on
        `<hub>.status` with the queue's name as routing key, so only a status queue of this hub
        qualifies (anything else would be refused by the broker's topic permissions, closing the
        publisher's channel); and only a status queue of the sending application, as its
        broker-checked `user_id` names it (no application may address another's, and a message
        without `user_id` none)."""
        if reply_to is None or user_id is None:
            return None
        prefix = f"{self.hub}.status."
        app, dot, tag = reply_to.removeprefix(prefix).partition(".")
        if not reply_to.startswith(prefix) or not dot or not STATUS_TAG.fullmatch(tag):
            return None
        if not APP_NAME.fullmatch(app) or app != user_id:
            return None
        return reply_to

    @staticmethod
    def exchange_feeding(queue: str) -> str | None:
        """The exchange a private queue is bound to, from its name: `<hub>.reply.…` queues get
        agent replies from `<hub>.replies`, `<hub>.status.…` queues order statuses from
        `<hub>.status`; other names none (a hub name has no dot, so the first part is it)."""
        hub, _, rest = queue.partition(".")
        kind = rest.partition(".")[0]
        return {"reply": f"{hub}.replies", "status": f"{hub}.status"}.get(kind)

    def input_queues(self, agents: tuple[str, ...] = AGENTS) -> list[str]:
        return [self.orders, *(self.agent(a) for a in agents)]

    def exchanges(self, agents: tuple[str, ...] = AGENTS) -> list[str]:
        """Every exchange `declare_topology` declares."""
        return [
            self.exchange,
            self.dead_letters,
            self.alerts,
            self.submit,
            self.replies,
            self.status,
            self.alert_dead_letters,
            *(
                exchange
                for q in self.input_queues(agents)
                for exchange in (self.retry(q), self.dlq(q), self.replay(q))
            ),
        ]

    def watched_queues(self, agents: tuple[str, ...] = AGENTS) -> list[str]:
        """Each input queue followed by its DLQ and its retry queue, as `stats` shows them."""
        inputs = self.input_queues(agents)
        return [q for base in inputs for q in (base, self.dlq(base), self.retry(base))]

    def durable_queues(self, agents: tuple[str, ...] = AGENTS) -> list[str]:
        """Every queue `declare_topology` declares: the input queues, their DLQs and retry
        queues, the alert feed."""
        inputs = self.input_queues(agents)
        return [
            *inputs,
            *(self.dlq(q) for q in inputs),
            *(self.retry(q) for q in inputs),
            self.alert_feed,
            self.alert_dead_letters,
        ]


@dataclass(frozen=True)
class QueuePolicy:
    quorum: bool
    delivery_limit: int
    orders_max_length: int
    alerts_max_length: int = 10_000
    """Notifications the alert feed keeps (ORDERFLOW_ALERTS_QUEUE_MAX_LENGTH)."""


def parse_version(version: str) -> tuple[int, ...]:
    parts = []
    for part in version.split("."):
        digits = "".join(ch for ch in part if ch.isdigit())
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts)


def supports_quorum(server_version: str) -> bool:
    return parse_version(server_version) >= QUORUM_SINCE


def input_queue_arguments(names: Names, queue: str, policy: QueuePolicy) -> dict[str, Any]:
    args: dict[str, Any] = {
        "x-dead-letter-exchange": names.dead_letters,
        "x-dead-letter-routing-key": queue,
    }
    if policy.quorum:
        # The consumer dead-letters at `delivery_limit` with its own reason; the broker's limit,
        # one above it, is the backstop for a consumer that dies on every delivery.
        args |= {"x-queue-type": "quorum", "x-delivery-limit": policy.delivery_limit + 1}
    if queue == names.orders:
        # Admission control: a full backlog refuses publishers instead of growing without bound.
        args |= {"x-max-length": policy.orders_max_length, "x-overflow": "reject-publish"}
    return args


def durable_queue_arguments(policy: QueuePolicy) -> dict[str, Any]:
    return {"x-queue-type": "quorum"} if policy.quorum else {}


def alert_feed_arguments(policy: QueuePolicy) -> dict[str, Any]:
    """The alert feed keeps the newest `alerts_max_length` notifications and drops the oldest
    beyond them: every alert is stored, so a dropped notification loses no record, and raising
    an alert never fails for a full queue (as `reject-publish` would make it)."""
    return durable_queue_arguments(policy) | {
        "x-max-length": policy.alerts_max_length,
        "x-overflow": "drop-head",
    }


def retry_queue_arguments(names: Names, queue: str) -> dict[str, Any]:
    """A quorum queue whose messages expire after their own delay (per-message TTL) and are
    then dead-lettered back to `queue`, at least once: a message set aside is never lost on
    its way back (at-least-once dead-lettering needs reject-publish, RabbitMQ 3.10)."""
    return {
        "x-queue-type": "quorum",
        "x-dead-letter-exchange": names.exchange,
        "x-dead-letter-routing-key": queue,
        "x-dead-letter-strategy": "at-least-once",
        "x-overflow": "reject-publish",
    }


async def declare_topology(
    admin: QueueAdmin, names: Names, policy: QueuePolicy, agents: tuple[str, ...] = AGENTS
) -> None:
    """Declare every exchange and durable queue of the hub. Idempotent with the same policy.
    A fanout exchange ignores the routing key; each queue is bound to one with its own name as
    the key, as aio-pika bound it before the port, so that a hub made by an older release gets
    no second binding."""
    for exchange, kind in (
        (names.exchange, ExchangeKind.DIRECT),
        (names.dead_letters, ExchangeKind.DIRECT),
        (names.alerts, ExchangeKind.FANOUT),
        (names.submit, ExchangeKind.FANOUT),
        (names.replies, ExchangeKind.TOPIC),
        (names.status, ExchangeKind.TOPIC),
    ):
        await admin.declare_exchange(exchange, kind)
    for queue in names.input_queues(agents):
        dlq, retry, replay = names.dlq(queue), names.retry(queue), names.replay(queue)
        await _declare_queue(admin, dlq, durable_queue_arguments(policy))
        await admin.bind(dlq, names.dead_letters, routing_key=queue)
        await admin.declare_exchange(dlq, ExchangeKind.FANOUT)
        await admin.bind(dlq, dlq, routing_key=dlq)
        await _declare_queue(admin, queue, input_queue_arguments(names, queue, policy))
        await admin.bind(queue, names.exchange, routing_key=queue)
        await admin.declare_exchange(retry, ExchangeKind.FANOUT)
        await _declare_queue(admin, retry, retry_queue_arguments(names, queue))
        await admin.bind(retry, retry, routing_key=retry)
        await admin.declare_exchange(replay, ExchangeKind.FANOUT)
        await admin.bind(queue, replay, routing_key=queue)
        if queue == names.orders:
            await admin.bind(queue, names.submit, routing_key=queue)
    await _declare_queue(admin, names.alert_feed, alert_feed_arguments(policy))
    await admin.bind(names.alert_feed, names.alerts, routing_key=names.alert_feed)
    await _declare_queue(admin, names.alert_dead_letters, durable_queue_arguments(policy))
    await admin.declare_exchange(names.alert_dead_letters, ExchangeKind.FANOUT)
    await admin.bind(
        names.alert_dead_letters, names.alert_dead_letters, routing_key=names.alert_dead_letters
    )


async def retire_unbounded_alerts_queue(admin: QueueAdmin, names: Names) -> int:
    """Delete the queue named like the alerts exchange, which releases before issue 14
    declared without a bound and without a reader (it grew by every alert, for good); how many
    notifications it held. Each of them is a copy of a stored alert (`orderflow alerts list`),
    and the feed has taken its place. None of this release's processes uses that name for a
    queue; deleting a queue that does not exist deletes nothing."""
    return await admin.delete(names.alerts)


async def _declare_queue(admin: QueueAdmin, name: str, arguments: dict[str, Any]) -> None:
    try:
        await admin.declare_queue(name, arguments=arguments)
    except QueueMismatch as exc:
        # A queue's arguments are fixed when it is created: a changed setting (the orders
        # queue's length, the redelivery limit) cannot be applied by declaring it again.
        wanted = ", ".join(f"{k}={v}" for k, v in sorted(arguments.items()))
        raise ConfigurationError(
            f"queue {name} exists with other arguments than these settings give ({wanted}); "
            "a queue's arguments cannot change: drain and delete it (or use a new hub), then "
            f"run `orderflow init` again [{exc}]"
        ) from exc


async def delete_topology(
    admin: QueueAdmin, names: Names, agents: tuple[str, ...] = AGENTS
) -> None:
    """Remove every queue and exchange of the hub (tests and maintenance)."""
    for queue in names.input_queues(agents):
        for name in (queue, names.dlq(queue), names.retry(queue)):
            await admin.delete(name)
    await admin.delete(names.alert_feed)
    await admin.delete(names.alert_dead_letters)
    await admin.delete(names.alerts)  # a hub made by a release before issue 14
    for exchange in names.exchanges(agents):
        await admin.delete(exchange, exchange=True)


async def existing_queue(connection: Connection, name: str) -> None:
    """That the queue `name` exists, as `orderflow init` declared it; a clear error naming
    `orderflow init` when it does not (a passive declare: nothing is made)."""
    admin = await connection.admin()
    try:
        await admin.depth(name)
    except QueueMissing:
        raise ConfigurationError(f"queue {name} does not exist: run `orderflow init`") from None
    finally:
        await admin.close()


async def queue_depths(connection: Connection, queues: Iterable[str]) -> dict[str, int | None]:
    """Messages ready in each of `queues`; None for a queue that could not be read (not
    declared: `orderflow init` makes them)."""
    depths: dict[str, int | None] = {}
    admin = await connection.admin()
    try:
        for queue in queues:
            try:
                depths[queue] = await admin.depth(queue)
            except Exception:
                depths[queue] = None
    finally:
        await admin.close()
    return depths
