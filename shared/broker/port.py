"""The broker port: what orderflow's processes need of a message broker, in a few small protocols
of our own (in the manner of dramatiq's `Broker` and `StubBroker`).

- `Connection`: one connection to the broker, and what the others are opened from;
- `Sender`: publishing with publisher confirms;
- `Feed`: a subscription's channel: consume, cancel (pause), consume again (resume), take one;
- `QueueAdmin`: declare, depth, purge, delete.

Two adapters implement them directly: RabbitMQ's (shared/broker/rabbitmq, on aio-pika, the only
code that imports it) and the reference broker in memory (shared/broker/memory). One contract
suite runs on both (tests/contract/test_broker_port.py). What is written once above the port:
the consumer's outcome table and its subscription that pauses and drains (shared/broker/
consumer.py, subscription.py), the dead-letter tools (dead_letters.py: list, show, replay,
purge), the hub's topology (topology.py) and the private reply and status queues (private.py).

What a delivery is to the code above: `Incoming`, a protocol of the properties it reads and the
three ways it settles one. aio-pika's incoming message has that shape already, so the RabbitMQ
adapter hands its deliveries on as they come (no copy on the hot path); the memory adapter has a
class of its own. What is published is an `Outgoing`, a plain value the adapter puts on the wire.

Errors: an adapter raises `QueueMissing` (a queue or exchange that does not exist),
`QueueMismatch` (declared already with other arguments, or another connection's exclusive
queue), `BrokerRefused` for another refusal (access, say), the `PublishError` family of
shared/errors.py for a publish the broker did not confirm, and `BrokerUnavailable` (an outage:
`ServiceUnavailable`) when the connection or channel is gone.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any, Protocol

from shared.errors import OrderflowError, ServiceUnavailable

Arguments = Mapping[str, Any]
"""A queue's `x-` arguments."""

Expiration = int | float | datetime | timedelta | None


class BrokerRefused(OrderflowError):
    """The broker refused an operation on an object: not an outage, retrying changes nothing."""


class QueueMissing(BrokerRefused):
    """The queue or exchange does not exist (`orderflow init` declares the hub's)."""


class QueueMismatch(BrokerRefused):
    """Declared already with other arguments, or another connection's exclusive queue."""

    def __init__(self, text: str, *, said: str | None = None) -> None:
        super().__init__(text)
        self.said = text if said is None else said
        """The broker's own words, whole (the text may be cut): what differs, for
        shared/broker/declarations.py."""


class BrokerUnavailable(ServiceUnavailable):
    """The connection or channel is gone."""


class ExchangeKind(StrEnum):
    DIRECT = "direct"
    FANOUT = "fanout"
    TOPIC = "topic"


@dataclass(slots=True)
class Outgoing:
    """A message to publish. Persistent unless said otherwise; `expiration` in seconds."""

    body: bytes
    headers: dict[str, Any] = field(default_factory=dict)
    message_id: str | None = None
    correlation_id: str | None = None
    reply_to: str | None = None
    type: str | None = None
    content_type: str | None = None
    user_id: str | None = None
    app_id: str | None = None
    expiration: float | None = None
    timestamp: datetime | None = None
    persistent: bool = True


class ChannelState(Protocol):
    """The channel a delivery came on, as far as settling it goes."""

    @property
    def is_closed(self) -> bool: ...


class Incoming(Protocol):
    """One delivery: what the code above the port reads of it, and how it settles it."""

    @property
    def body(self) -> bytes: ...
    @property
    def headers(self) -> Mapping[str, Any]: ...
    @property
    def message_id(self) -> str | None: ...
    @property
    def correlation_id(self) -> str | None: ...
    @property
    def reply_to(self) -> str | None: ...
    @property
    def type(self) -> str | None: ...
    @property
    def content_type(self) -> str | None: ...
    @property
    def user_id(self) -> str | None: ...
    @property
    def app_id(self) -> str | None: ...
    @property
    def expiration(self) -> Expiration: ...
    @property
    def timestamp(self) -> datetime | None: ...
    @property
    def redelivered(self) -> bool | None: ...
    @property
    def delivery_tag(self) -> int | None: ...
    @property
    def routing_key(self) -> str | None: ...
    @property
    def exchange(self) -> str | None: ...
    @property
    def processed(self) -> bool:
        """Settled already through this delivery (acked, nacked or rejected). One settled by a
        `multiple` ack of a later delivery shows it on the memory adapter, not on RabbitMQ's
        (aio-pika does not know): the consumer's acks keep their own book (acks.py)."""
        ...

    @property
    def channel(self) -> ChannelState:
        """The channel it came on; raises when that is gone."""
        ...

    # Settling on a channel that is gone, or twice, raises an error that is no outage (waiting
    # brings the delivery back to no channel): the memory adapter's `BrokerRefused`, aio-pika's
    # own on RabbitMQ (its deliveries pass through unwrapped).
    async def ack(self, multiple: bool = False) -> None: ...
    async def nack(self, multiple: bool = False, requeue: bool = True) -> None: ...
    async def reject(self, requeue: bool = False) -> None: ...


Take = Callable[[Incoming], Awaitable[None]]
"""What a feed hands each delivery to (each in a task of its own)."""


class Sender(Protocol):
    """A confirming channel: `publish` returns once the broker confirmed the message, and raises
    `PublishUnroutable` (no queue takes it), `PublishRejected` (a queue refused it) or
    `PublishError` (no confirm within the adapter's timeout, or the connection failed)."""

    async def publish(self, message: Outgoing, *, exchange: str, routing_key: str) -> None: ...

    async def close(self) -> None: ...


class Feed(Protocol):
    """A channel that consumes, with its prefetch: at most that many deliveries unsettled."""

    async def consume(
        self, queue: str, take: Take, *, ack: bool = True, restore: bool = True
    ) -> str:
        """Deliveries of `queue` to `take` until cancelled: the consumer's tag. `ack=False`:
        each counts as settled when sent (replies). `restore`: the adapter consumes again after
        a reconnection (False: the caller does, told by `Connection.on_reconnect`, which suits
        a queue that may be gone by then). `QueueMissing` if there is no such queue."""
        ...

    async def own_queue(self, name: str, *, bind_to: str | None, routing_key: str = "") -> None:
        """Declare a queue of this connection's own (exclusive, deleted with its last consumer,
        not durable), bound to the exchange `bind_to`; declared and bound again with the feed
        after a reconnection, before its consumer is restored."""
        ...

    async def cancel(self, tag: str) -> None: ...

    async def consuming(self, tag: str) -> bool:
        """Whether the broker still delivers to this consumer (its channel open, and the
        consumer not cancelled by the broker, as when its queue is deleted)."""
        ...

    async def get(self, queue: str) -> Incoming | None:
        """One message of `queue`, unsettled (None: it is empty)."""
        ...

    async def close(self) -> None:
        """Close the channel: what it holds unsettled goes back, counted as failed."""
        ...


class QueueAdmin(Protocol):
    """Declaring and inspecting the broker's objects. A call the broker refuses leaves the admin
    usable (the adapter opens a new channel when the refusal closed its own)."""

    async def declare_exchange(self, name: str, kind: ExchangeKind) -> None: ...

    async def declare_queue(
        self,
        name: str,
        *,
        arguments: Arguments | None = None,
        durable: bool = True,
        exclusive: bool = False,
        auto_delete: bool = False,
    ) -> None: ...

    async def bind(self, queue: str, exchange: str, routing_key: str = "") -> None: ...

    async def depth(self, name: str) -> int:
        """Messages ready in the queue; `QueueMissing` if there is none of that name."""
        ...

    async def purge(self, name: str) -> int:
        """Delete every ready message of the queue: how many."""
        ...

    async def has_exchange(self, name: str) -> bool: ...

    async def delete(self, name: str, *, exchange: bool = False) -> int:
        """Delete a queue (how many messages it held) or an exchange (0); absent: 0."""
        ...

    async def close(self) -> None: ...


@dataclass(frozen=True)
class BrokerInfo:
    version: str
    """The server's version, as it reports it."""
    node: str
    """The node this connection reached (redacted URL)."""
    user: str | None
    """The connection's user: the `user_id` the publisher (publisher.py) puts on every message
    (the adapters' senders put none of their own)."""


class Connection(Protocol):
    """One connection to the broker; channels are opened from it."""

    @property
    def info(self) -> BrokerInfo: ...

    @property
    def connected(self) -> bool:
        """Up now (False while a lost connection is being restored)."""
        ...

    async def sender(self, *, timeout: float) -> Sender:
        """A confirming channel; each publish waits at most `timeout` for its confirm."""
        ...

    async def feed(self, *, prefetch: int) -> Feed:
        """A consuming channel; `prefetch` 0: no limit (a feed that only `get`s)."""
        ...

    async def admin(self) -> QueueAdmin: ...

    def on_reconnect(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call `callback` after each reconnection; returns what removes it."""
        ...

    async def close(self) -> None: ...
