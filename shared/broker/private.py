"""A process's private reply queue: exclusive, gone with its process (and so are late replies)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from aio_pika.abc import (
    AbstractChannel,
    AbstractIncomingMessage,
    AbstractQueue,
    AbstractRobustConnection,
)

from shared.broker.topology import Names
from shared.domain.messages import Contract, decode
from shared.errors import ContractViolation

log = logging.getLogger(__name__)

Listener = Callable[[Contract, AbstractIncomingMessage], None]


class PrivateQueue:
    """Replies are not precious: one lost is a deadline that passes, which the supervisor handles.
    So they are consumed without acks, and a bad one is logged and dropped, never requeued.

    The queue is bound, with its own name as the routing key, to the exchange that feeds queues
    of its kind (`Names.exchange_feeding`: `<hub>.replies` or `<hub>.status`), so that who may
    send to it is a matter of permissions on that exchange, never of the default exchange."""

    def __init__(
        self,
        connection: AbstractRobustConnection,
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
        self._channel: AbstractChannel | None = None
        self._queue: AbstractQueue | None = None
        self._tag: str | None = None

    async def start(self) -> None:
        self._channel = await self._connection.channel()
        await self._channel.set_qos(prefetch_count=self._prefetch)
        self._queue = await self._channel.declare_queue(
            self.name, exclusive=True, auto_delete=True, durable=False
        )
        feeding = Names.exchange_feeding(self.name)
        if feeding is not None:
            await self._queue.bind(feeding, routing_key=self.name)
        self._tag = await self._queue.consume(self._on_message, no_ack=True)

    async def stop(self) -> None:
        if self._queue is not None and self._tag is not None:
            with contextlib.suppress(Exception):
                await self._queue.cancel(self._tag)
        if self._channel is not None:
            with contextlib.suppress(Exception):
                await self._channel.close()

    async def _on_message(self, message: AbstractIncomingMessage) -> None:
        try:
            contract = decode(message.type, message.body, max_bytes=self._max_bytes)
        except ContractViolation as exc:
            log.warning("dropping a bad reply", extra={"reason": exc.reason, "error": str(exc)})
            return
        try:
            self._listener(contract, message)
        except Exception:
            log.exception("reply listener failed")


class ReplyRouter:
    """Matches replies to the requests waiting for them, by correlation id."""

    def __init__(self) -> None:
        self._waiting: dict[str, asyncio.Future[Contract]] = {}

    def expect(self, correlation_id: str) -> asyncio.Future[Contract]:
        future: asyncio.Future[Contract] = asyncio.get_running_loop().create_future()
        self._waiting[correlation_id] = future
        return future

    def forget(self, correlation_id: str) -> None:
        self._waiting.pop(correlation_id, None)

    def deliver(self, contract: Contract, message: AbstractIncomingMessage) -> None:
        future = self._waiting.get(message.correlation_id or "")
        if future is None or future.done():
            log.info(
                "late or unknown reply ignored", extra={"correlation_id": message.correlation_id}
            )
            return
        future.set_result(contract)
