"""Publishing with confirms on RabbitMQ: the port's `Sender`, on one confirming channel renewed
after a refusal."""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Awaitable, Callable
from contextlib import suppress

import aio_pika
import aiormq
from aio_pika.abc import AbstractChannel, AbstractExchange

from shared.broker.port import Outgoing
from shared.errors import PublishError, PublishRejected, PublishUnroutable

log = logging.getLogger(__name__)

RENEW_AFTER_S = 1.0
"""A refused publish (a nack) renews the sender's channel, unless that channel is younger than
this. RabbitMQ 3.10 (before rabbitmq-server#9221) can refuse every publish of a channel to a
quorum queue for as long as the queue's old leader stays down: a channel that first publishes to
the queue while the queue's record still names the dead leader asks that node alone, and keeps
asking it. A channel opened once the new leader is recorded is served; the age limit bounds the
renewals to one a second while a queue refuses publishes for another reason (a full backlog)."""

TRANSIENT = (aiormq.exceptions.AMQPError, ConnectionError, RuntimeError)
"""What a channel's operation raises when its channel or connection fails."""


def wire_message(message: Outgoing) -> aio_pika.Message:
    """The port's message as aio-pika sends it."""
    return aio_pika.Message(
        message.body,
        headers=message.headers,
        message_id=message.message_id,
        correlation_id=message.correlation_id,
        reply_to=message.reply_to,
        type=message.type,
        content_type=message.content_type,
        user_id=message.user_id,
        app_id=message.app_id,
        expiration=message.expiration,
        timestamp=message.timestamp,
        delivery_mode=(
            aio_pika.DeliveryMode.PERSISTENT
            if message.persistent
            else aio_pika.DeliveryMode.NOT_PERSISTENT
        ),
    )


class _Lane:
    """One confirming channel, with the exchanges looked up on it and the count of publishes
    waiting on it for their confirm."""

    def __init__(self, channel: AbstractChannel, renewable_at: float) -> None:
        self.channel = channel
        self.renewable_at = renewable_at
        self.refused: str | None = None
        """The target of the last publish the broker refused on this channel."""
        self.exchanges: dict[str, AbstractExchange] = {}
        self.waiting = 0
        self.retired = False

    async def exchange(self, name: str) -> AbstractExchange:
        if name == "":
            return self.channel.default_exchange
        if name not in self.exchanges:
            self.exchanges[name] = await self.channel.get_exchange(name, ensure=False)
        return self.exchanges[name]


class RabbitSender:
    """Publishes on one confirming channel, renewed after a refusal (`RENEW_AFTER_S`). Safe to
    share between tasks of one process."""

    def __init__(
        self,
        channel: AbstractChannel,
        *,
        timeout: float,
        reopen: Callable[[], Awaitable[AbstractChannel]] | None = None,
    ) -> None:
        self._lane = _Lane(channel, renewable_at=-math.inf)
        self._timeout = timeout
        self._reopen = reopen
        """Opens a channel like the first; None: the channel is never renewed."""
        self._renewing = asyncio.Lock()

    async def close(self) -> None:
        await self._lane.channel.close()

    async def publish(self, message: Outgoing, *, exchange: str, routing_key: str) -> None:
        """Publish and wait for the confirm; raise a `PublishError` unless the broker took it."""
        await self.send(wire_message(message), exchange=exchange, routing_key=routing_key)

    async def send(self, message: aio_pika.Message, *, exchange: str, routing_key: str) -> None:
        """`publish`, of a message as aio-pika sends it."""
        target = f"{exchange or '(default)'}/{routing_key}"
        lane: _Lane | None = None
        try:
            # The whole of it within the timeout: a robust channel whose connection is being
            # restored waits for it before it publishes, for as long as that takes.
            async with asyncio.timeout(self._timeout):
                lane = await self._current()
                lane.waiting += 1
                ex = await lane.exchange(exchange)
                await ex.publish(message, routing_key, mandatory=True, timeout=self._timeout)
        except aiormq.exceptions.PublishError as exc:
            raise PublishUnroutable(f"no queue takes messages for {target}") from exc
        except aiormq.exceptions.DeliveryError as exc:
            if lane is not None:
                lane.refused = target
            raise PublishRejected(
                f"the broker refused the message for {target} (queue full or unavailable)"
            ) from exc
        except TimeoutError as exc:
            raise PublishError(
                f"no confirm for {target} within {self._timeout}s (the broker did not answer, "
                "or the connection to it was being restored)"
            ) from exc
        except TRANSIENT as exc:
            if lane is not None and isinstance(exc, aiormq.exceptions.ChannelClosed):
                # The broker closed the channel (a missing exchange, say): the next publish
                # goes on a new one rather than on this dead one.
                lane.refused = target
            raise PublishError(f"publishing to {target} failed: {exc!r}") from exc
        finally:
            if lane is not None:
                lane.waiting -= 1
                if lane.retired and lane.waiting == 0:
                    await self._retire(lane)

    async def _current(self) -> _Lane:
        """The lane to publish on: a new one once the broker refused a publish on the current
        one, unless that was renewed (or tried to be) less than `RENEW_AFTER_S` ago. A channel
        that cannot be opened now (its connection being restored) leaves the current one in
        use, to be tried again after `RENEW_AFTER_S`."""
        loop = asyncio.get_running_loop()
        lane = self._lane
        if self._reopen is None or lane.refused is None or loop.time() < lane.renewable_at:
            return lane
        async with self._renewing:
            if lane is not self._lane:
                return self._lane
            lane.renewable_at = loop.time() + RENEW_AFTER_S
            try:
                channel = await self._reopen()
            except TRANSIENT as exc:
                log.warning(
                    "could not open a new channel to publish on",
                    extra={"refused": lane.refused, "error": repr(exc)},
                )
                return lane
            self._lane = _Lane(channel, renewable_at=loop.time() + RENEW_AFTER_S)
            lane.retired = True
            if lane.waiting == 0:
                await self._retire(lane)
        log.warning(
            "RabbitMQ refused a publish: publishing on a new channel",
            extra={"refused": lane.refused},
        )
        return self._lane

    async def _retire(self, lane: _Lane) -> None:
        """Close a renewed channel once no publish waits on it for its confirm."""
        with suppress(*TRANSIENT, TimeoutError):
            async with asyncio.timeout(self._timeout):
                await lane.channel.close()
