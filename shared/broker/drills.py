"""Fault drills: a publisher wrapped around the real one that misbehaves on purpose.

The bootstrap (shared/bootstrap.py, `open_publisher`) wraps a process's publisher in
`DrillPublisher` only when a drill's setting is non-zero, so the real `Publisher` and the
processes hold no fault code. The settings keep their meaning (the nemesis and the fault suite set
them through the environment):

- duplicate delivery (`ORDERFLOW_FAULT_DUPLICATE_RATE`): that share of the messages a process
  publishes goes out twice, with the same message id;
- late replies (`ORDERFLOW_FAULT_REPLY_DELAY_RATE`, `ORDERFLOW_FAULT_REPLY_DELAY_MS`): that share
  of step replies (which agents alone publish) is held back before it is published, long enough
  to arrive after its step's deadline.

Each drill draws from a generator of its own seeded by `ORDERFLOW_FAULT_SEED`, so one seed makes
the same choices whichever drills are on. Dead letters and retry copies (`publish_raw`) are
passed on untouched.
"""

from __future__ import annotations

import asyncio
import functools
import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from shared.broker.port import Outgoing
from shared.broker.publisher import Publishing
from shared.domain.messages import Contract, StepReply


@dataclass(frozen=True)
class Drills:
    duplicate_rate: float = 0.0
    reply_delay_rate: float = 0.0
    reply_delay_s: float = 0.0
    seed: int | None = None

    @property
    def on(self) -> bool:
        return self.duplicate_rate > 0 or self.reply_delay_rate > 0


class DrillPublisher:
    """Publishes through `publisher`, duplicating and delaying as `drills` say."""

    def __init__(self, publisher: Publishing, drills: Drills) -> None:
        self._publisher = publisher
        self._drills = drills
        self._duplicates = random.Random(drills.seed)
        self._delays = random.Random(drills.seed)

    async def publish(
        self,
        contract: Contract,
        *,
        exchange: str,
        routing_key: str,
        message_id: str,
        correlation_id: str | None = None,
        reply_to: str | None = None,
        headers: Mapping[str, Any] | None = None,
    ) -> None:
        if self._held_back(contract):
            await asyncio.sleep(self._drills.reply_delay_s)  # it arrives after its deadline
        send = functools.partial(
            self._publisher.publish,
            contract,
            exchange=exchange,
            routing_key=routing_key,
            message_id=message_id,
            correlation_id=correlation_id,
            reply_to=reply_to,
            headers=headers,
        )
        await send()
        if self._doubled():
            await send()  # the same message id: a duplicate delivery

    def _held_back(self, contract: Contract) -> bool:
        rate = self._drills.reply_delay_rate
        return isinstance(contract, StepReply) and bool(rate) and self._delays.random() < rate

    def _doubled(self) -> bool:
        rate = self._drills.duplicate_rate
        return bool(rate) and self._duplicates.random() < rate

    async def publish_raw(self, message: Outgoing, *, exchange: str, routing_key: str) -> None:
        await self._publisher.publish_raw(message, exchange=exchange, routing_key=routing_key)

    async def close(self) -> None:
        await self._publisher.close()


def drilled(publisher: Publishing, drills: Drills) -> Publishing:
    """`publisher` itself when no drill is on; else wrapped in the drills."""
    return DrillPublisher(publisher, drills) if drills.on else publisher
