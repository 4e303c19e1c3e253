"""Contract: an outage longer than the consumer's hold never dead-letters a message, and what
counts as a delivery is what RabbitMQ counts (real RabbitMQ, inbox on the real PostgreSQL)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

import pytest

from shared.broker.consumer import Delivery
from shared.domain.coordination import InboxOutcome
from shared.errors import StoreUnavailable
from shared.store.port import InboxClaim
from shared.store.postgres import PostgresStore
from tests.support.broker_harness import LIMIT, Broker, send
from tests.support.waiting import eventually

pytestmark = [pytest.mark.rabbitmq, pytest.mark.postgres]


class DownUntil:
    """The real store, unreachable (every inbox claim fails as a connection refused would) until
    `back_when` is set and holds: an outage measured in what the consumer did, not in a time
    its backoff's jitter may fill with fewer returns, as a PostgreSQL restart that takes long
    looks to a consumer."""

    def __init__(self, store: PostgresStore) -> None:
        self._store = store
        self.back_when: Callable[[], bool] = lambda: False
        self.refused = 0

    def _down(self) -> bool:
        return not self.back_when()

    async def inbox_claim_many(
        self, queue: str, claims: Sequence[InboxClaim], *, now: datetime
    ) -> list[InboxOutcome]:
        if self._down():
            self.refused += 1
            raise StoreUnavailable("connection refused (test)")
        return await self._store.inbox_claim_many(queue, claims, now=now)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


async def test_an_outage_many_times_the_patience_dead_letters_nothing(broker: Broker) -> None:
    """Held for the patience, returned to the queue, held again, …: well past the redelivery
    limit's worth of returns, and the message is handled once the store is back, never
    dead-lettered (before, each return was a requeue that counted as a delivery)."""
    queue = broker.names.agent("inventory")
    handled: list[Delivery] = []

    async def handler(d: Delivery) -> None:
        handled.append(d)

    patience = 0.3
    down = DownUntil(broker.store)
    consumer = await broker.consume(
        queue, handler, store=down, outage_patience=patience, retry_delay=0.2
    )
    down.back_when = lambda: consumer.stats.held_returns > LIMIT + 1
    message_id = await send(broker, queue)

    async def done() -> bool:
        return len(handled) == 1

    await eventually(done, timeout=30, what="the message handled once the store is back")
    assert consumer.stats.held_returns > LIMIT, "returned more often than the limit allows"
    assert consumer.stats.dead_lettered == 0 and await broker.dead_letters(queue) == []
    assert handled[0].message_id == message_id
    assert handled[0].deliveries == 1, "no return counted as a delivery"
    assert handled[0].retries == 0, "a return is not a delayed retry"
    assert handled[0].user_id == consumer._policy.own_user  # the sender kept
