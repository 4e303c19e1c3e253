"""What bounds the memory, connections and time the API gives whoever calls it (issue 33): a
request's body by its size and by the time it takes to arrive, a request's head by the time it
takes, the live status streams by token and in all, and unknown tokens by client address.

The body and head limits act before routing and before authentication: a client without a
token makes the API read, hold and wait for no more than what refusing it costs.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import ClassVar, cast

import h11
from fastapi import HTTPException
from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol

MIB = 1 << 20
BULK_BODY_BYTES = 32 * MIB
"""An operator's bulk request: a resubmission sending back a dry run's `selected` (100,000
orders at most, 17 MB at the longest ids) or a replay naming dead letters (10,000 at most)."""
BULK_BODY_S = 300.0
"""The time such a body may take to arrive (32 MiB in 300 s: about 110 KB/s)."""


@dataclass(frozen=True)
class Allowance:
    """How large a request's body may be, and how long it may take to arrive once its head did."""

    bytes: int
    seconds: float


class BodyRefused(HTTPException):
    """A body past its allowance: an HTTPException, so that FastAPI's body reader lets it
    through to the app's handler (any other error there becomes a 400)."""


def _too_large(limit: int) -> BodyRefused:
    return BodyRefused(413, f"the request's body is past the limit of {limit} bytes")


class BodyLimit:
    """ASGI middleware, outermost: a body larger than the request's allowance is refused 413 (at
    once by its `Content-Length`, else as soon as the bytes received pass it), one not received
    whole in its time 408. The connection then ends (`H11WithReadTimeout`): the rest of the
    body is never read."""

    def __init__(self, app: ASGIApp, allowance: Callable[[Scope], Awaitable[Allowance]]) -> None:
        self.app = app
        self.allowance = allowance

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        length = headers.get("content-length")
        declared = int(length) if length is not None and length.isdigit() else None
        allowed = await self.allowance(scope)
        if declared is not None and declared > allowed.bytes:
            await _answer(_too_large(allowed.bytes), scope, receive, send)
            return
        body = _Body(receive, allowed, whole="transfer-encoding" not in headers and not declared)
        started = False

        async def sending(message: Message) -> None:
            nonlocal started
            started = True
            await send(message)

        try:
            await self.app(scope, body.receive, sending)
        except BodyRefused as refused:  # FastAPI answers it; any other reader may not
            if started:
                raise
            await _answer(refused, scope, receive, send)


class _Body:
    """A request's body as the app receives it, counted and timed against its allowance."""

    def __init__(self, receive: Receive, allowed: Allowance, *, whole: bool) -> None:
        self._receive = receive
        self.allowed = allowed
        self.whole = whole
        self.received = 0
        self._deadline = asyncio.get_running_loop().time() + allowed.seconds

    async def receive(self) -> Message:
        if self.whole:  # read: what comes now is the client leaving
            return await self._receive()
        left = self._deadline - asyncio.get_running_loop().time()
        try:
            async with asyncio.timeout(max(left, 0)):
                message = await self._receive()
        except TimeoutError:
            raise BodyRefused(
                408, f"the request's body did not arrive within {self.allowed.seconds:g} s"
            ) from None
        if message["type"] != "http.request":
            self.whole = True
            return message
        self.received += len(message.get("body", b""))
        if self.received > self.allowed.bytes:
            raise _too_large(self.allowed.bytes)
        self.whole = not message.get("more_body", False)
        return message


async def _answer(refused: BodyRefused, scope: Scope, receive: Receive, send: Send) -> None:
    response = JSONResponse(
        {"detail": refused.detail}, status_code=refused.status_code, headers=refused.headers
    )
    await response(scope, receive, send)


class H11WithReadTimeout(H11Protocol):
    """uvicorn's h11 protocol, with two ends it lacks.

    A deadline on each request's head: from the connection's opening, or from the first byte
    of a later request, its head must arrive whole within `read_timeout_s`, or the connection
    is closed. uvicorn has none: a connection that sent nothing, or half a head, was held for
    ever, each counting against `limit_concurrency`. Between requests its keep-alive timeout
    applies, as before.

    An end to a body answered before it was read (a 413, a 408, an endpoint that reads no
    body): uvicorn would read and drop the rest for as long as the client sends (an endless
    body: for ever). The connection ends instead, gently: a close with unread data resets it,
    and a reset can take the answer with it before the client reads it, so our side ends first
    and what still comes is dropped for `LINGER_S` at most (as nginx's lingering close)."""

    read_timeout_s: ClassVar[float] = 10.0
    LINGER_S: ClassVar[float] = 2.0
    _head_due: asyncio.TimerHandle | None = None
    _lingering: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)  # type: ignore[arg-type]
        self._head_due = self.loop.call_later(self.read_timeout_s, self._head_late)

    def on_response_complete(self) -> None:
        if self.conn.their_state is not h11.SEND_BODY or self.transport.is_closing():
            super().on_response_complete()
            return
        self.server_state.total_requests += 1
        self.flow.resume_reading()
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self._lingering = self.loop.call_later(self.LINGER_S, self.transport.close)

    def data_received(self, data: bytes) -> None:
        if self._lingering is not None:
            return  # the rest of a body answered already: dropped
        super().data_received(data)
        if self.conn.their_state is not h11.IDLE:  # a head arrived (or the connection failed)
            self._forget_head()
        elif self._head_due is None and not self.transport.is_closing():
            self._head_due = self.loop.call_later(self.read_timeout_s, self._head_late)

    def connection_lost(self, exc: Exception | None) -> None:
        self._forget_head()
        if self._lingering is not None:
            self._lingering.cancel()
        super().connection_lost(exc)

    def _forget_head(self) -> None:
        if self._head_due is not None:
            self._head_due.cancel()
            self._head_due = None

    def _head_late(self) -> None:
        self._head_due = None
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            self.transport.close()


def h11_with_read_timeout(seconds: float) -> type[H11Protocol]:
    """The protocol class to give uvicorn (it makes one per connection from its config)."""
    return cast(
        type[H11Protocol],
        type("H11WithReadTimeout", (H11WithReadTimeout,), {"read_timeout_s": seconds}),
    )


class Streams:
    """The live status streams the API serves: `most` in all, `per_token` per token, each for
    `lifetime_s` at most (the stream ends itself then; this only says when a place frees)."""

    def __init__(
        self,
        most: int,
        per_token: int,
        lifetime_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.most, self.per_token, self.lifetime_s = most, per_token, lifetime_s
        self._clock = clock
        self._open: dict[str, list[float]] = {}

    def take(self, holder: str) -> Callable[[], None]:
        """A place for a stream of `holder` (a token's name), and what gives it back (once,
        however often it is called); refused 429 past the token's share, 503 past the whole."""
        now = self._clock()
        mine = self._open.get(holder, [])
        if len(mine) >= self.per_token:
            raise HTTPException(
                429,
                f"token {holder} follows {len(mine)} orders already, the most one token may "
                f"({self.per_token}): close a stream first",
                headers={"Retry-After": self._wait(min(mine), now)},
            )
        if self.count >= self.most:
            oldest = min(min(started) for started in self._open.values())
            raise HTTPException(
                503,
                f"the API serves {self.count} live streams, its most ({self.most}): "
                "follow the order again shortly",
                headers={"Retry-After": self._wait(oldest, now)},
            )
        self._open.setdefault(holder, []).append(now)
        given_back = False

        def give_back() -> None:
            nonlocal given_back
            if given_back:
                return
            given_back = True
            left = self._open[holder]
            left.remove(now)
            if not left:
                del self._open[holder]

        return give_back

    @property
    def count(self) -> int:
        return sum(len(started) for started in self._open.values())

    def _wait(self, started: float, now: float) -> str:
        return str(max(1, math.ceil(started + self.lifetime_s - now)))


class FailedAuth:
    """Unknown tokens by client address. Past `most` within `window_s` of an address's first
    one, the address is refused (429) until the window ends, before its token is even looked
    up; except with a token that authenticated lately (the newest `remembered`, by digest), so
    that a shop behind the same address as a guesser (one proxy, one NAT) still gets in. The
    newest `addresses` addresses are kept, so memory stays bounded however many send."""

    def __init__(
        self,
        most: int = 20,
        window_s: float = 60.0,
        addresses: int = 10_000,
        remembered: int = 1_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.most, self.window_s = most, window_s
        self._addresses, self._remembered = addresses, remembered
        self._clock = clock
        self._failures: OrderedDict[str, tuple[float, int]] = OrderedDict()
        self._good: OrderedDict[str, None] = OrderedDict()

    def refusal(self, address: str, digest: str) -> int | None:
        """Seconds until `address` may try a token again (None: it may now)."""
        found = self._failures.get(address)
        if found is None or digest in self._good:
            return None
        first, count = found
        left = first + self.window_s - self._clock()
        if left <= 0 or count < self.most:
            return None
        return max(1, math.ceil(left))

    def failed(self, address: str) -> None:
        now = self._clock()
        first, count = self._failures.pop(address, (now, 0))
        if first + self.window_s <= now:
            first, count = now, 0
        self._failures[address] = (first, count + 1)
        while len(self._failures) > self._addresses:
            self._failures.popitem(last=False)

    def succeeded(self, digest: str) -> None:
        self._good.pop(digest, None)
        self._good[digest] = None
        while len(self._good) > self._remembered:
            self._good.popitem(last=False)
