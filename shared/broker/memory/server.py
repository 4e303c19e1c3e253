"""The reference broker in memory: RabbitMQ's semantics that orderflow's processes rely on.

Exchanges (direct, fanout, topic, and the default exchange), bindings, and queues with the
arguments `shared/broker/topology.py` declares: quorum queues that count returned deliveries
(`x-delivery-count`) and dead-letter past their delivery limit (`x-delivery-limit`, or a
policy's; counted, and by default limited, as RabbitMQ 3.x or 4.x does: `QuorumRules`);
dead-letter exchanges and routing keys; per-message TTL dead-lettered on expiry (the retry
queues); `x-max-length` with `reject-publish` (the publisher sees a nack) or `drop-head`.
Consumers get each delivery as a task of its own, at most their prefetch unacknowledged; an
ack, a nack or a reject settles a delivery, and a closed channel or connection returns what it
held (redelivered, counted). Exclusive queues die with their connection, auto-delete queues
with their last consumer.
Every message's `user_id`, when set, must be the publishing connection's user, as RabbitMQ
checks it.

What it does not model: permissions, vhosts, a broker restart's loss of non-durable queues
beyond what `outage` says, priorities, transactions. It is exercised by the broker contract
suite (tests/contract, as `[memory]`) beside the real RabbitMQ, and is what
`orderflow simulate` runs every process on.

`Network` is the simulation's hand on the wire: it may hold a message back before it reaches
its queue (reordering what was sent close together) or deliver it twice.
"""

from __future__ import annotations

import asyncio
import itertools
import re
from typing import Any

from shared import clock
from shared.broker.memory.objects import (
    NOT_FOUND,
    PRECONDITION_FAILED,
    RABBITMQ_3,
    RESOURCE_LOCKED,
    Consumer,
    Exchange,
    Network,
    Properties,
    Queue,
    QuorumRules,
    Refused,
    Stored,
    again,
    decode,
    encode,
    ttl_seconds,
)


class MemoryBroker:
    """One broker: exchanges and queues shared by every connection made to it."""

    VERSION = "3.10.0 (orderflow memory broker)"

    def __init__(self, network: Network | None = None, *, rules: QuorumRules = RABBITMQ_3) -> None:
        self.exchanges: dict[str, Exchange] = {}
        self.queues: dict[str, Queue] = {}
        self.network = network
        self.rules = rules
        """How quorum queues count returns and where they stop them (3.x by default)."""
        self.delivery_limit_policies: list[tuple[str, int]] = []
        """(a policy's pattern, its `delivery-limit`): a queue whose name the first matching
        pattern finds (a regex search, as RabbitMQ's) takes that policy's limit."""
        self.down = False
        """A broker outage: nothing is taken or delivered until it ends."""
        self._tags = itertools.count(1)
        self._connections: list[Any] = []

    def next_tag(self) -> int:
        """A number no other delivery, consumer or queue of this broker has."""
        return next(self._tags)

    # -- topology
    def declare_exchange(self, name: str, kind: str) -> Exchange:
        existing = self.exchanges.get(name)
        if existing is not None:
            if existing.kind != kind:
                raise Refused(PRECONDITION_FAILED, f"exchange {name} is a {existing.kind}")
            return existing
        self.exchanges[name] = Exchange(name, kind)
        return self.exchanges[name]

    def exchange(self, name: str) -> Exchange:
        if name not in self.exchanges:
            raise Refused(NOT_FOUND, f"no exchange '{name}'")
        return self.exchanges[name]

    def declare_queue(
        self,
        name: str,
        *,
        owner: Any,
        durable: bool = False,
        auto_delete: bool = False,
        exclusive: bool = False,
        arguments: dict[str, Any] | None = None,
    ) -> Queue:
        wanted = Queue(name, durable, auto_delete, owner if exclusive else None, arguments or {})
        existing = self.queues.get(name)
        if existing is None:
            self.queues[name] = wanted
            return wanted
        self._check_access(existing, owner)
        if existing.settings() != wanted.settings():
            raise Refused(PRECONDITION_FAILED, _inequivalence(existing, wanted))
        return existing

    def queue(self, name: str, owner: Any = None) -> Queue:
        if name not in self.queues:
            raise Refused(NOT_FOUND, f"no queue '{name}'")
        queue = self.queues[name]
        self._check_access(queue, owner)
        return queue

    @staticmethod
    def _check_access(queue: Queue, owner: Any) -> None:
        if queue.exclusive_to is not None and queue.exclusive_to is not owner:
            raise Refused(RESOURCE_LOCKED, f"queue '{queue.name}' is exclusive to another")

    def bind(self, queue: str, exchange: str, routing_key: str, owner: Any = None) -> None:
        self.queue(queue, owner)
        bindings = self.exchange(exchange).bindings
        if (queue, routing_key) not in bindings:
            bindings.append((queue, routing_key))

    def delete_queue(self, name: str) -> int:
        queue = self.queues.pop(name, None)
        if queue is None:
            return 0
        for exchange in self.exchanges.values():
            exchange.bindings = [(q, k) for q, k in exchange.bindings if q != name]
        for consumer in queue.consumers:  # the broker cancels them
            consumer.in_hand.clear()
            consumer.owner.consumers.pop(consumer.tag, None)
        return len(queue.ready)

    def purge(self, name: str, owner: Any = None) -> int:
        """Drop every ready message of the queue (not those delivered): how many."""
        queue = self.queue(name, owner)
        count = len(queue.ready)
        queue.ready.clear()
        return count

    def take(self, name: str, owner: Any = None) -> tuple[Queue, Stored] | None:
        """The first ready message of the queue, taken off it (a `basic.get`); None: empty."""
        queue = self.queue(name, owner)
        return (queue, queue.ready.popleft()) if queue.ready else None

    def delete_exchange(self, name: str) -> None:
        self.exchanges.pop(name, None)

    # -- publishing
    def publish(
        self, exchange: str, routing_key: str, body: bytes, header: bytes, sender: str = ""
    ) -> str:
        """Route a message from user `sender`; 'ok', 'unroutable', or 'rejected' (a full
        reject-publish queue)."""
        if exchange == "":
            targets = [routing_key] if routing_key in self.queues else []
        else:
            targets = self.exchange(exchange).routes(routing_key)
        if not targets:
            return "unroutable"
        outcome = "ok"
        for name in targets:
            message = Stored(body, header, exchange, routing_key)
            if not self._offer(self.queues[name], message, sender):
                outcome = "rejected"
        return outcome

    def publish_as(
        self, user: str, exchange: str, routing_key: str, body: bytes, header: bytes
    ) -> str:
        """`publish` from a connection of `user`, after RabbitMQ's check of the `user_id` a
        message carries: refused (precondition failed) when it names another user."""
        claimed = decode(header).user_id
        if claimed is not None and claimed != user:
            raise Refused(
                PRECONDITION_FAILED,
                f"user_id property set to '{claimed}' but authenticated user was '{user}'",
            )
        return self.publish(exchange, routing_key, body, header, user)

    def _offer(self, queue: Queue, message: Stored, sender: str) -> bool:
        """Whether `queue` takes the message (False: full, and it refuses publishers)."""
        limit = queue.arguments.get("x-max-length")
        if limit is not None and len(queue.ready) >= limit:
            if queue.arguments.get("x-overflow") == "reject-publish":
                return False
            queue.ready.popleft()  # drop-head: the newest are kept
        network = self.network
        copies = 2 if network is not None and network.duplicate(queue.name, sender) else 1
        delay = network.delay(queue.name, sender) if network is not None else 0.0
        for _ in range(copies):
            if delay > 0:
                asyncio.get_running_loop().call_later(delay, self._arrive, queue, again(message))
            else:
                self._arrive(queue, again(message))
        return True

    def _arrive(self, queue: Queue, message: Stored) -> None:
        if self.queues.get(queue.name) is not queue:
            return  # deleted meanwhile
        ttl = ttl_seconds(decode(message.header).expiration)
        if ttl is not None:
            message.expires_at = clock.monotonic() + ttl
            asyncio.get_running_loop().call_later(ttl, self._expire, queue, message)
        queue.ready.append(message)
        self.wake(queue)

    def _expire(self, queue: Queue, message: Stored) -> None:
        if message in queue.ready:
            queue.ready.remove(message)
            self.dead_letter(queue, message, "expired")

    def dead_letter(self, queue: Queue, message: Stored, reason: str) -> None:
        """To the queue's dead-letter exchange, with an `x-death` record (or dropped)."""
        exchange = queue.arguments.get("x-dead-letter-exchange")
        if exchange is None or exchange not in self.exchanges:
            return
        key = queue.arguments.get("x-dead-letter-routing-key", message.routing_key)
        props = decode(message.header)
        props.expiration = None
        death: dict[str, Any] = {
            "reason": reason,
            "queue": queue.name,
            "count": 1,
            "exchange": message.exchange,
        }
        props.headers = {**(props.headers or {}), "x-death": [death]}
        props.headers.pop("x-delivery-count", None)
        self.publish(exchange, key, message.body, encode(props, len(message.body)))

    # -- delivering
    def subscribe(self, consumer: Consumer) -> None:
        queue = self.queue(consumer.queue, getattr(consumer.owner, "connection", None))
        queue.consumers.append(consumer)
        queue.had_consumers = True
        self.wake(queue)

    def unsubscribe(self, consumer: Consumer) -> None:
        queue = self.queues.get(consumer.queue)
        if queue is None or consumer not in queue.consumers:
            return
        queue.consumers.remove(consumer)
        if queue.auto_delete and not queue.consumers and queue.had_consumers:
            self.delete_queue(queue.name)

    def wake(self, queue: Queue) -> None:
        asyncio.get_running_loop().call_soon(self._dispatch, queue)

    def _dispatch(self, queue: Queue) -> None:
        if self.down or self.queues.get(queue.name) is not queue:
            return
        while queue.ready:
            consumer = self._next_consumer(queue)
            if consumer is None:
                return
            message = queue.ready.popleft()
            tag = self.next_tag()
            if not consumer.no_ack:
                consumer.in_hand.add(tag)
                consumer.owner.hold(tag, queue, consumer, message)
            asyncio.get_running_loop().create_task(
                consumer.callback(message, tag), context=consumer.context.copy()
            )

    def _next_consumer(self, queue: Queue) -> Consumer | None:
        """Round robin over the consumers with room under their prefetch."""
        count = len(queue.consumers)
        for i in range(count):
            consumer = queue.consumers[(queue.next_consumer + i) % count]
            if consumer.no_ack or len(consumer.in_hand) < consumer.prefetch:
                queue.next_consumer = (queue.next_consumer + i + 1) % count
                return consumer
        return None

    def settle(self, queue: Queue, consumer: Consumer, message: Stored, tag: int, how: str) -> None:
        """An ack (`ack`), a return to the queue as a failed delivery (`requeue`: a reject) or
        not (`return`: a nack), or a rejection without one (`drop`), of the delivery `tag`."""
        consumer.in_hand.discard(tag)
        if how in ("requeue", "return"):
            self.give_back(queue, message, failed=how == "requeue")
        elif how == "drop":
            self.dead_letter(queue, message, "rejected")
        self.wake(queue)

    def give_back(self, queue: Queue, message: Stored, *, failed: bool = True) -> None:
        """A delivery returned unsettled (`failed`: as a failed delivery, as a reject or a
        closed channel returns it): counted, and dead-lettered past the delivery limit."""
        if self.queues.get(queue.name) is not queue:
            return
        message.returned += 1
        message.failed += failed
        message.redelivered = True
        limit = self.delivery_limit(queue)
        counted = message.returned if self.rules.nack_counts else message.failed
        if queue.quorum and limit is not None and counted > limit:
            self.dead_letter(queue, message, "delivery_limit")
            return
        queue.ready.appendleft(message)

    def delivery_limit(self, queue: Queue) -> int | None:
        """The delivery limit of a quorum queue, by its argument, its policy and the rules."""
        policy = next(
            (
                limit
                for pattern, limit in self.delivery_limit_policies
                if re.search(pattern, queue.name)
            ),
            None,
        )
        return self.rules.limit(queue.arguments.get("x-delivery-limit"), policy)

    # -- connections and outages
    def attach(self, connection: Any) -> None:
        self._connections.append(connection)

    def connections(self) -> list[Any]:
        """The connections open now."""
        return list(self._connections)

    def detach(self, connection: Any) -> None:
        """A connection closed: its exclusive queues go with it."""
        if connection in self._connections:
            self._connections.remove(connection)
        for name in [n for n, q in self.queues.items() if q.exclusive_to is connection]:
            self.delete_queue(name)

    def outage(self, down: bool) -> None:
        """The broker goes away (every connection drops, returning what it held; transient
        queues lose their messages) or comes back (connections recover, consumers resume)."""
        self.down = down
        for connection in list(self._connections):
            connection.link(not down)
        if down:
            for queue in self.queues.values():
                if not queue.durable:
                    queue.ready.clear()
        else:
            for queue in list(self.queues.values()):
                self.wake(queue)

    def delivered(self, message: Stored) -> Properties:
        """The properties a delivery carries: a quorum queue adds its count of returns."""
        props = decode(message.header)
        count = message.returned if self.rules.default_delivery_limit is None else message.failed
        if count:  # RabbitMQ 4 counts failed deliveries only in the header
            props.headers = {**(props.headers or {}), "x-delivery-count": count}
        return props


def _inequivalence(existing: Queue, wanted: Queue) -> str:
    """RabbitMQ's words for the first setting a declaration found different (it compares
    `durable`, `auto_delete`, then the arguments), which shared/broker/declarations.py reads."""
    start = f"inequivalent arg '{{}}' for queue '{existing.name}' in vhost '/': received "
    for setting in ("durable", "auto_delete"):
        have, want = getattr(existing, setting), getattr(wanted, setting)
        if have != want:
            return start.format(setting) + f"'{_flag(want)}' but current is '{_flag(have)}'"
    for key in sorted(set(existing.arguments) | set(wanted.arguments)):
        have, want = existing.arguments.get(key), wanted.arguments.get(key)
        if have != want:
            return start.format(key) + f"{_argument(want)} but current is {_argument(have)}"
    return f"inequivalent arg 'exclusive' for queue '{existing.name}' in vhost '/'"


def _flag(value: bool) -> str:
    return "true" if value else "false"


def _argument(value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, bool):
        return f"the value '{_flag(value)}' of type 'bool'"
    kind = "long" if isinstance(value, int) else "double" if isinstance(value, float) else "longstr"
    return f"the value '{value}' of type '{kind}'"
