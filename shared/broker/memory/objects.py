"""What the memory broker holds: messages as they were sent, queues and their arguments,
exchanges and how they route, consumers and what they have in hand."""

from __future__ import annotations

import contextvars
import fnmatch
from collections import deque
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, Protocol

from pamqp.commands import Basic
from pamqp.header import ContentHeader

Properties = Basic.Properties


class Network(Protocol):
    def delay(self, queue: str, sender: str) -> float:
        """Seconds a message from user `sender` takes to reach `queue` (0: at once)."""

    def duplicate(self, queue: str, sender: str) -> bool:
        """Whether `queue` gets this message twice (a publisher that sent it again)."""


def encode(props: Properties, body_size: int) -> bytes:
    """Properties as they travel: the content header frame, encoded by pamqp as a client's."""
    return ContentHeader(0, body_size, props).marshal()


def decode(header: bytes) -> Properties:
    """Properties as a client reads them off the wire (with orderflow's tolerant decoding)."""
    frame = ContentHeader()
    frame.unmarshal(header)
    return frame.properties


@dataclass
class Stored:
    """A message in a queue: what was published, and what the queue knows of it."""

    body: bytes
    header: bytes
    """Its properties as they were sent (`encode`)."""
    exchange: str
    routing_key: str
    returned: int = 0
    """Times it came back to the queue unsettled (RabbitMQ 4's `acquired-count`; 3.x's
    delivery count)."""
    failed: int = 0
    """Those of its returns that counted as a failed delivery (a reject, a closed channel or
    connection; not a `basic.nack`): RabbitMQ 4's `delivery-count`."""
    redelivered: bool = False
    expires_at: float | None = None


@dataclass
class Consumer:
    tag: str
    queue: str
    owner: Any
    """The client channel it consumes on (shared/broker/memory/channels.py)."""
    callback: Callable[[Stored, int], Coroutine[Any, Any, None]]
    prefetch: int
    no_ack: bool
    context: contextvars.Context
    in_hand: set[int] = field(default_factory=set)


@dataclass
class Queue:
    name: str
    durable: bool
    auto_delete: bool
    exclusive_to: Any
    """The connection that owns an exclusive queue (None: not exclusive)."""
    arguments: dict[str, Any]
    ready: deque[Stored] = field(default_factory=deque)
    consumers: list[Consumer] = field(default_factory=list)
    next_consumer: int = 0
    had_consumers: bool = False

    @property
    def quorum(self) -> bool:
        return self.arguments.get("x-queue-type") == "quorum"

    def settings(self) -> tuple[bool, bool, Any, dict[str, Any]]:
        return (self.durable, self.auto_delete, self.exclusive_to is not None, self.arguments)


@dataclass
class Exchange:
    name: str
    kind: str
    bindings: list[tuple[str, str]] = field(default_factory=list)
    """(queue, routing key) in the order they were made."""

    def routes(self, routing_key: str) -> list[str]:
        if self.kind == "fanout":
            targets = [queue for queue, _ in self.bindings]
        elif self.kind == "topic":
            targets = [q for q, key in self.bindings if _topic_match(key, routing_key)]
        else:
            targets = [q for q, key in self.bindings if key == routing_key]
        return list(dict.fromkeys(targets))


def _topic_match(pattern: str, key: str) -> bool:
    """AMQP topic matching: `*` one word, `#` zero or more."""
    if "#" not in pattern and "*" not in pattern:
        return pattern == key
    return _words(pattern.split("."), key.split("."))


def _words(pattern: list[str], key: list[str]) -> bool:
    if not pattern:
        return not key
    head, rest = pattern[0], pattern[1:]
    if head == "#":
        return any(_words(rest, key[i:]) for i in range(len(key) + 1))
    if not key:
        return False
    return (head == "*" or fnmatch.fnmatchcase(key[0], head)) and _words(rest, key[1:])


@dataclass(frozen=True)
class QuorumRules:
    """How a release of RabbitMQ counts a quorum queue's returned deliveries, and where it
    stops them (RabbitMQ's quorum queue guide, "Poison Message Handling")."""

    default_delivery_limit: int | None = None
    """The limit of a queue that has none set (`x-delivery-limit` or a policy's
    `delivery-limit`): none before 4.0, 20 from 4.0 on."""
    nack_counts: bool = True
    """Whether a `basic.nack` (requeue) counts towards the limit: before 4.3 every return does
    (the acquired count); from 4.3 on only a failed delivery does."""

    def limit(self, argument: int | None, policy: int | None) -> int | None:
        """The limit in force, from the queue's argument and its policy's (rabbit_quorum_queue:
        the smaller of the two, or the larger where one is negative; negative: none)."""
        if argument is None and policy is None:
            return self.default_delivery_limit
        if argument is None or policy is None:
            chosen = argument if policy is None else policy
        elif argument < 0 or policy < 0:
            chosen = max(argument, policy)
        else:
            chosen = min(argument, policy)
        return None if chosen is None or chosen < 0 else chosen


RABBITMQ_3 = QuorumRules()
RABBITMQ_4_0 = QuorumRules(default_delivery_limit=20)
"""4.0 to 4.2."""
RABBITMQ_4_3 = QuorumRules(default_delivery_limit=20, nack_counts=False)


class Refused(Exception):
    """What the broker answers an operation it refuses: the AMQP reply code and text."""

    def __init__(self, code: int, text: str) -> None:
        super().__init__(f"{code} {text}")
        self.code = code
        self.text = text


NOT_FOUND, PRECONDITION_FAILED, RESOURCE_LOCKED = 404, 406, 405


def again(message: Stored) -> Stored:
    return Stored(message.body, message.header, message.exchange, message.routing_key)


def ttl_seconds(expiration: Any) -> float | None:
    """A per-message TTL (milliseconds, as text on the wire)."""
    if expiration in (None, ""):
        return None
    try:
        return max(0.0, float(expiration) / 1000)
    except (TypeError, ValueError):
        return None
