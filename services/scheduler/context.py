"""What every attempt a scheduler runs needs: fenced writes, and asking an agent."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

from shared.broker.private import ReplyRouter
from shared.broker.publisher import Publisher
from shared.broker.topology import Names
from shared.config import Settings
from shared.domain.messages import StepReply, StepRequest
from shared.domain.models import StateRecord
from shared.domain.timing import utcnow
from shared.domain.updates import Update
from shared.errors import PublishError
from shared.reporting import Reporter
from shared.store.port import StateStore

log = logging.getLogger(__name__)


class Superseded(Exception):
    """A fenced write matched nothing: another attempt owns the order now."""


@dataclass
class AttemptContext:
    store: StateStore
    publisher: Publisher
    names: Names
    router: ReplyRouter
    reply_queue: str
    report: Reporter
    settings: Settings

    async def write(self, order_id: str, update: Update) -> StateRecord:
        """Apply a fenced update; raise `Superseded` when its condition no longer holds."""
        after = await self.store.update_state(order_id, update.expect, update.changes)
        if after is None:
            raise Superseded(order_id)
        return after

    async def ask(self, agent: str, message_id: str, **fields: Any) -> StepReply | None:
        """Send a step request and race its reply against its deadline; None if the deadline
        won (or the request could not be sent: the supervisor recovers it either way)."""
        request = StepRequest(reply_to=self.reply_queue, **fields)
        waiting = self.router.expect(message_id)
        try:
            await self.publisher.publish(
                request,
                exchange=self.names.exchange,
                routing_key=self.names.agent(agent),
                message_id=message_id,
                correlation_id=message_id,
            )
            left = (request.complete_by - utcnow()).total_seconds()
            reply = await asyncio.wait_for(waiting, timeout=max(0.0, left))
        except TimeoutError:
            return None
        except PublishError:
            log.exception(
                "could not send a step request; the supervisor will recover it",
                extra={"order_id": request.order_id, "step": request.step},
            )
            return None
        finally:
            self.router.forget(message_id)
        if not isinstance(reply, StepReply):
            log.warning("a non-reply on the reply queue", extra={"message_id": message_id})
            return None
        return reply
