"""The API's limits without a server (services/api/limits.py): the body limit against every
split of a body into parts (hypothesis), the unknown-token throttle against a model of it over
generated schedules, the places of the live streams, and the allowances against the largest
bodies the API's own models accept."""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import Awaitable, Callable
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from starlette.exceptions import HTTPException

from services.api.app import create_app
from services.api.auth import BULK_BODIES, body_allowance
from services.api.limits import (
    BULK_BODY_BYTES,
    Allowance,
    BodyLimit,
    FailedAuth,
    Streams,
)
from services.api.models import BulkResubmit, NewOrder, Replay
from shared.config import Settings
from shared.errors import ServiceUnavailable

Message = dict[str, Any]
LIMIT = 1000


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _scope(length: int | None, chunked: bool) -> dict[str, Any]:
    headers = [(b"content-type", b"application/json")]
    if length is not None:
        headers.append((b"content-length", str(length).encode()))
    if chunked:
        headers.append((b"transfer-encoding", b"chunked"))
    return {"type": "http", "method": "POST", "path": "/orders", "headers": headers}


class Exchange:
    """One request: its body's parts as the server receives them (then nothing more: the client
    waits, or leaves), an app that reads the whole body and answers 200, and what was sent."""

    def __init__(self, parts: list[bytes], *, stall: bool) -> None:
        self.parts = [
            {"type": "http.request", "body": part, "more_body": n < len(parts) - 1 or stall}
            for n, part in enumerate(parts)
        ]
        self.stall = stall
        self.read: bytes | None = None
        self.sent: list[Message] = []

    async def receive(self) -> Message:
        if self.parts:
            return self.parts.pop(0)
        if self.stall:
            await asyncio.Event().wait()
        return {"type": "http.disconnect"}

    async def app(self, scope: Any, receive: Callable[[], Awaitable[Message]], send: Any) -> None:
        body = b""
        more = True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        self.read = body
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    async def send(self, message: Message) -> None:
        self.sent.append(message)


def _drive(
    parts: list[bytes],
    *,
    length: int | None,
    chunked: bool = False,
    stall: bool = False,
    seconds: float = 5.0,
) -> Exchange:
    """One request through `BodyLimit`, allowed `LIMIT` bytes within `seconds`."""
    exchange = Exchange(parts, stall=stall)

    async def allowance(scope: Any) -> Allowance:
        return Allowance(LIMIT, seconds)

    limit = BodyLimit(exchange.app, allowance)  # type: ignore[arg-type]
    asyncio.run(limit(_scope(length, chunked), exchange.receive, exchange.send))  # type: ignore[arg-type]
    return exchange


def _status(exchange: Exchange) -> tuple[int, str]:
    sent = exchange.sent
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    status = sent[0]["status"]
    return status, json.loads(body)["detail"] if status != 200 else body.decode()


@settings(max_examples=200, deadline=None)
@given(
    size=st.integers(0, 3 * LIMIT),
    cuts=st.lists(st.integers(0, 3 * LIMIT), max_size=8),
    declared=st.booleans(),
)
def test_a_body_passes_whole_within_the_limit_and_is_refused_past_it(
    size: int, cuts: list[int], declared: bool
) -> None:
    """However a body is split into parts, with its length declared or chunked: the app reads
    it whole up to the limit; past it the answer is a 413, and the app never reads past it."""
    body = b"x" * size
    points = sorted({0, size, *(c for c in cuts if c <= size)})
    parts = [body[a:b] for a, b in itertools.pairwise(points)] or [b""]
    exchange = _drive(parts, length=size if declared else None, chunked=not declared)
    status, text = _status(exchange)
    if size <= LIMIT:
        assert (status, exchange.read) == (200, body)
    else:
        assert status == 413 and f"limit of {LIMIT} bytes" in text
        assert exchange.read is None


def test_a_declared_length_past_the_limit_is_refused_before_anything_is_read() -> None:
    exchange = _drive([], length=100 * LIMIT, stall=True)
    assert _status(exchange)[0] == 413 and exchange.read is None


def test_a_body_that_stops_coming_is_answered_408_at_its_deadline() -> None:
    exchange = _drive([b"{"], length=10, stall=True, seconds=0.05)
    status, text = _status(exchange)
    assert status == 408 and "0.05 s" in text and exchange.read is None


# -- unknown tokens


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["a", "b", "c"]),  # the address
            st.sampled_from(["good", "bad-1", "bad-2"]),  # the token
            st.floats(0, 30),  # seconds since the previous request
        ),
        max_size=80,
    )
)
def test_an_address_is_refused_only_past_its_unknown_tokens_and_never_with_a_good_one(
    schedule: list[tuple[str, str, float]],
) -> None:
    """Against a model: each address's window of `most` unknown tokens; a token that worked is
    let through to the lookup whatever its address; another address is never refused for
    them."""
    clock = Clock()
    throttle = FailedAuth(most=5, window_s=60.0, clock=clock)
    windows: dict[str, tuple[float, int]] = {}
    known_good = False
    for address, token, wait in schedule:
        clock.now += wait
        first, count = windows.get(address, (clock.now, 0))
        if first + 60.0 <= clock.now:
            first, count = clock.now, 0
        expected = count >= 5 and not (token == "good" and known_good)
        refused = throttle.refusal(address, token)
        assert (refused is not None) == expected, (address, token, windows)
        if refused is not None:
            assert 1 <= refused <= 60
            continue
        if token == "good":
            throttle.succeeded(token)
            known_good = True
        else:
            throttle.failed(address)
            windows[address] = (first, count + 1)


def test_the_throttle_keeps_the_newest_addresses_only() -> None:
    clock = Clock()
    throttle = FailedAuth(most=1, addresses=3, clock=clock)
    for n in range(10):
        throttle.failed(f"10.0.0.{n}")
    assert [throttle.refusal(f"10.0.0.{n}", "x") is not None for n in range(10)] == [False] * 7 + [
        True
    ] * 3


# -- the live streams


def test_streams_are_placed_per_token_and_in_all_and_given_back_once() -> None:
    clock = Clock()
    streams = Streams(most=3, per_token=2, lifetime_s=300.0, clock=clock)
    first = streams.take("acme")
    clock.now += 100
    streams.take("acme")
    with pytest.raises(HTTPException) as mine:
        streams.take("acme")
    assert mine.value.status_code == 429 and mine.value.headers == {"Retry-After": "200"}
    streams.take("bolt")
    with pytest.raises(HTTPException) as all_:
        streams.take("bolt")
    assert all_.value.status_code == 503 and "(3)" in all_.value.detail
    first()
    first()  # a second give-back frees nothing more
    assert streams.count == 2
    streams.take("acme")
    with pytest.raises(HTTPException):
        streams.take("carl")


# -- the allowances against the models


def test_the_largest_order_fits_well_within_the_ordinary_allowance() -> None:
    """Every field at its longest, each character escaped as a client's JSON may (12 bytes for
    one outside the BMP), indented: still under half of `max_message_bytes`."""
    wide = "\U0001f375"
    order = NewOrder.model_validate(
        {
            "order_id": "o" * 40,
            "customer_id": wide * 64,
            "lines": [
                {"sku": f"{n:02}" + "s" * 62, "quantity": 10_000, "unit_price_cents": 100_000_000}
                for n in range(100)
            ],
            "currency": "EUR",
            "payment_token": "tok_" + "t" * 60,
            "shipping_address": {
                "name": wide * 200,
                "line1": wide * 200,
                "city": wide * 200,
                "postal_code": wide * 20,
                "country": "DE",
            },
        }
    )
    size = len(json.dumps(order.model_dump(mode="json"), indent=2, ensure_ascii=True))
    assert size < Settings().broker.max_message_bytes / 2, size


def test_the_largest_bulk_bodies_fit_the_bulk_allowance() -> None:
    selected = {
        "order_id": "shop-" + "s" * 35 + "/" + "o" * 64,
        "seen": "2026-12-04T10:11:12+00:00",
    }
    resubmit = BulkResubmit.model_validate({"dry_run": True, "selected": [selected]})
    limit = BulkResubmit.model_fields["selected"].metadata[0].max_length
    one = len(json.dumps(resubmit.model_dump(mode="json")["selected"][0])) + 2
    assert limit * one < BULK_BODY_BYTES, limit * one
    replay_limit = Replay.model_fields["message_ids"].metadata[0].max_length
    assert replay_limit * (300 + 4) < BULK_BODY_BYTES


def test_the_bulk_allowance_names_operator_endpoints_that_exist() -> None:
    paths = create_app(None).openapi()["paths"]
    for method, path in BULK_BODIES:
        assert method.lower() in paths[path], (method, path)


def test_a_store_outage_during_the_bulk_allowance_is_a_503() -> None:
    """The bulk allowance looks the token up outside FastAPI's handlers, where a store outage
    was a 500 (found by review): it falls back to the ordinary allowance, and the endpoint's
    own look-up answers 503 with `Retry-After`, as every endpoint does."""

    class Down:
        async def token_find(self, digest: str) -> None:
            raise ServiceUnavailable("store down")

        async def token_use(self, *_: Any, **__: Any) -> None:
            raise ServiceUnavailable("store down")

    limits = SimpleNamespace(api_read_timeout_s=10.0)
    ctx = SimpleNamespace(
        settings=limits, max_message_bytes=65_536, store=Down(), failed_auth=FailedAuth()
    )
    app = create_app(None)
    app.state.context = ctx
    app.add_middleware(BodyLimit, allowance=body_allowance(ctx))  # type: ignore[arg-type]
    sent: list[dict[str, Any]] = []
    bodies = [{"type": "http.request", "body": b"{}", "more_body": False}]

    async def receive() -> dict[str, Any]:
        return bodies.pop(0) if bodies else {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "method": "POST",
        "path": "/ops/resubmit",
        "raw_path": b"/ops/resubmit",
        "query_string": b"",
        "root_path": "",
        "scheme": "http",
        "http_version": "1.1",
        "headers": [
            (b"authorization", b"Bearer x"),
            (b"content-type", b"application/json"),
            (b"content-length", b"2"),
        ],
        "client": ("192.0.2.1", 1),
        "server": ("t", 80),
    }
    asyncio.run(app(scope, receive, send))  # type: ignore[arg-type]
    start = next(m for m in sent if m["type"] == "http.response.start")
    assert start["status"] == 503 and (b"retry-after", b"5") in start["headers"], start
