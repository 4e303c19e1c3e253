"""Attacks on the HTTP API from outside (issue 33, items 6-8), against the real `serve api`
beside the whole topology, as the clients they come from: no token, a shop's, a viewer's and an
operator's (made by the real CLI), one client address and another.

One topology and one API serve the whole module, with its limits made small so that each
attack shows in seconds: a request must arrive within 1 s, 32 connections at most, 4 live
streams at most and 3 per token, each for 5 s at most.
"""

from __future__ import annotations

import asyncio
import json
import re
import signal
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest
import pytest_asyncio

from tests.support.api import ApiClient, start_api, token
from tests.support.factories import order_data
from tests.support.raw_http import MIB, closed_after, memory_kib, upload
from tests.support.topology import Topology, running_topology
from tests.support.waiting import eventually

pytestmark = [
    pytest.mark.rabbitmq,
    pytest.mark.postgres,
    pytest.mark.asyncio(loop_scope="module"),
]

READ_TIMEOUT_S = 1.0
MAX_CONNECTIONS = 32
STREAMS_MAX = 4
STREAMS_PER_TOKEN = 3
STREAM_MAX_S = 5.0
LIMITS = {
    "ORDERFLOW_API_READ_TIMEOUT_S": str(READ_TIMEOUT_S),
    "ORDERFLOW_API_MAX_CONNECTIONS": str(MAX_CONNECTIONS),
    "ORDERFLOW_API_STREAMS_MAX": str(STREAMS_MAX),
    "ORDERFLOW_API_STREAMS_PER_TOKEN": str(STREAMS_PER_TOKEN),
    "ORDERFLOW_API_STREAM_MAX_S": str(STREAM_MAX_S),
}
SLACK_S = 4.0
"""What a loaded machine may add to a deadline of the API's before the test calls it missed."""
STOP = "Completed", "Compensated", "Cancelled", "Failed"
"""The statuses a stream ends at: where the order rests, for good or until an operator acts."""


@dataclass
class Site:
    topo: Topology
    api: ApiClient
    port: int
    pid: int
    tokens: dict[str, str] = field(default_factory=dict)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def site(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Site]:
    hub = f"t{uuid.uuid4().hex[:12]}"
    async with running_topology(hub, tmp_path_factory.mktemp("http")) as topo:
        await topo.start_all()
        api = await start_api(topo, **LIMITS)
        names = {"shop": "acme", "other": "bolt", "viewer": "vera", "operator": "otto"}
        made = await asyncio.gather(
            *(
                asyncio.to_thread(token, topo, "shop" if key == "other" else key, name)
                for key, name in names.items()
            )
        )
        try:
            yield Site(
                topo,
                api,
                int(api.base.rsplit(":", 1)[1]),
                topo.procs["api"].pid,
                dict(zip(names, made, strict=True)),
            )
        finally:
            await api.close()


def new_order(order_id: str, **overrides: Any) -> dict[str, Any]:
    return order_data(order_id, **overrides).model_dump(mode="json")


# -- item 6: bodies


async def test_large_bodies_without_a_token_are_refused_unread(site: Site) -> None:
    """A 100 MiB body and an endless chunked one, each without a token: 413 before anything is
    read past the limit, and the API's peak resident memory barely moves."""
    before = memory_kib(site.pid)["VmHWM"]
    declared, endless = await asyncio.gather(
        upload(site.port, "/orders", size=100 * MIB),
        upload(site.port, "/orders", size=None, give_up_after=100 * MIB),
    )
    grew_mib = (memory_kib(site.pid)["VmHWM"] - before) / 1024
    assert declared.status == 413, declared
    assert endless.status == 413, endless
    assert "limit" in endless.text and "limit" in declared.text
    assert grew_mib < 24, f"the API's peak resident memory grew {grew_mib:.0f} MiB"
    # A token changes nothing for an ordinary endpoint, not even an operator's.
    for who in ("shop", "viewer", "operator"):
        answer = await upload(site.port, "/orders", size=MIB, token=site.tokens[who])
        assert answer.status == 413, (who, answer)


async def test_the_largest_legitimate_bodies_are_taken(site: Site) -> None:
    """An order of 100 lines passes; a bulk resubmission sending back a long dry run's
    selection (1,000 orders, 80 KB) passes with an operator's token only."""
    lines = [{"sku": f"sku-{n:03}", "quantity": 10_000, "unit_price_cents": 1} for n in range(100)]
    big = new_order("o-big", lines=lines, customer_id="c" * 64)
    placed = await site.api.call("POST", "/orders", site.tokens["shop"], big)
    assert placed.status in (201, 202), placed
    selected = [
        {"order_id": f"shop/acme.o-{n:06}", "seen": "2026-12-04T10:11:12.123456+00:00"}
        for n in range(1000)
    ]
    body = {"dry_run": True, "selected": selected}
    assert len(json.dumps(body)) > 64 * 1024
    done = await site.api.call("POST", "/ops/resubmit", site.tokens["operator"], body)
    assert done.status == 200, done.status
    for who in (None, site.tokens["viewer"], site.tokens["shop"]):
        refused = await site.api.call("POST", "/ops/resubmit", who, body)
        assert refused.status == 413, refused


# -- item 7: connections, streams, failed authentication


async def test_a_half_sent_request_and_a_silent_connection_are_cut(site: Site) -> None:
    wait = READ_TIMEOUT_S + SLACK_S
    head = b"GET /catalogue HTTP/1.1\r\nHost: 127.0.0.1\r\n"
    body = b"POST /orders HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 900\r\n\r\n{"
    (head_s, _), (body_s, answer), (silent_s, _) = await asyncio.gather(
        closed_after(site.port, head, timeout=wait),
        closed_after(site.port, body, timeout=wait),
        closed_after(site.port, b"", timeout=wait),
    )
    assert head_s is not None, f"a half-sent head was still open after {wait} s"
    assert body_s is not None, f"a half-sent body was still open after {wait} s"
    assert silent_s is not None, f"a silent connection was still open after {wait} s"
    assert answer.startswith(b"HTTP/1.1 408 "), answer


async def test_connections_past_the_limit_are_refused_until_the_silent_ones_are_cut(
    site: Site,
) -> None:
    held: list[asyncio.StreamWriter] = []
    try:
        for _ in range(MAX_CONNECTIONS):
            held.append((await asyncio.open_connection("127.0.0.1", site.port))[1])

        async def refused() -> bool:  # once the API has taken them all in
            return (await site.api.call("GET", "/openapi.json")).status == 503

        await eventually(refused, timeout=SLACK_S, interval=0.02, what="a request refused 503")

        async def served() -> bool:
            return (await site.api.call("GET", "/openapi.json")).status == 200

        await eventually(served, timeout=READ_TIMEOUT_S + SLACK_S, what="the API serving again")
    finally:
        for writer in held:
            writer.close()


@dataclass
class Followed:
    statuses: list[str]
    seconds: float
    refused: tuple[int, str, str | None] | None = None
    """A stream refused: its status, detail and Retry-After."""


async def follow_once(
    site: Site, order_id: str, who: str, opened: asyncio.Event | None = None
) -> Followed:
    """One stream of an order, read until the API ends it."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    headers = {"Authorization": f"Bearer {site.tokens[who]}"}
    timeout = aiohttp.ClientTimeout(total=60)
    url = f"{site.api.base}/orders/{order_id}/events"
    async with site.api.session.get(url, headers=headers, timeout=timeout) as response:
        if response.status != 200:
            detail = (await response.json())["detail"]
            return Followed([], 0.0, (response.status, detail, response.headers.get("Retry-After")))
        statuses: list[str] = []
        async for raw in response.content:
            line = raw.decode().rstrip("\n")
            if line.startswith("data: "):
                statuses.append(json.loads(line[6:])["status"])
                if opened is not None:
                    opened.set()
        return Followed(statuses, loop.time() - start)


async def follow(site: Site, order_id: str, who: str = "shop") -> list[str]:
    """Follow an order as a client does: open its stream again whenever the API ends one before
    the order stops; every status seen."""
    seen: list[str] = []
    while not seen or seen[-1] not in STOP:
        stream = await follow_once(site, order_id, who)
        assert stream.refused is None, stream
        assert stream.seconds < STREAM_MAX_S + SLACK_S, stream
        seen += stream.statuses
    return seen


@contextmanager
def scheduler_paused(topo: Topology) -> Iterator[None]:
    """Orders stay Received meanwhile."""
    topo.signal("scheduler-1", signal.SIGSTOP)
    try:
        yield
    finally:
        topo.signal("scheduler-1", signal.SIGCONT)


async def test_streams_are_capped_per_token_and_overall_and_end_within_their_lifetime(
    site: Site,
) -> None:
    with scheduler_paused(site.topo):
        for who in ("shop", "other"):
            placed = await site.api.call("POST", "/orders", site.tokens[who], new_order("o-wait"))
            assert placed.status == 201, placed
        openings = [asyncio.Event() for _ in range(STREAMS_MAX)]
        holders = ["shop"] * STREAMS_PER_TOKEN + ["other"]
        streams = [
            asyncio.create_task(follow_once(site, "o-wait", who, opened))
            for who, opened in zip(holders, openings, strict=True)
        ]
        try:
            await asyncio.wait_for(asyncio.gather(*(o.wait() for o in openings)), SLACK_S)
            one_too_many = await follow_once(site, "o-wait", "shop")
            assert one_too_many.refused is not None, one_too_many
            status, detail, retry_after = one_too_many.refused
            assert status == 429 and str(STREAMS_PER_TOKEN) in detail and retry_after, detail
            past_all = await follow_once(site, "o-wait", "other")
            assert past_all.refused is not None, past_all
            status, detail, retry_after = past_all.refused
            assert status == 503 and str(STREAMS_MAX) in detail and retry_after, detail
            for ended in await asyncio.gather(*streams):
                assert ended.statuses == ["Received"], ended
                assert STREAM_MAX_S - 0.5 < ended.seconds < STREAM_MAX_S + SLACK_S, ended
        finally:
            for stream in streams:
                stream.cancel()
        # Their places are free again; a stream of an order cancelled meanwhile ends at once.
        opened = asyncio.Event()
        again = asyncio.create_task(follow_once(site, "o-wait", "shop", opened))
        await asyncio.wait_for(opened.wait(), SLACK_S)
        cancelled = await site.api.call("POST", "/orders/o-wait/cancel", site.tokens["shop"])
        assert cancelled.status == 200, cancelled
        ended = await again
        assert ended.statuses[-1] == "Cancelled" and ended.seconds < STREAM_MAX_S, ended


async def test_a_stream_ends_at_every_state_where_the_order_stops(site: Site) -> None:
    """Failed (an undo refused for good: CompensationFailed), and Completed and Compensated."""
    await site.topo.remote.set_faults(reject_operations=["inventory.release"])
    try:
        placed = await site.api.call(
            "POST",
            "/orders",
            site.tokens["shop"],
            new_order("o-fail", payment_token="tok_declined"),
        )
        assert placed.status in (201, 202), placed
        failed = await asyncio.wait_for(follow(site, "o-fail"), 60)
        assert failed[-1] == "Failed", failed
    finally:
        await site.topo.remote.set_faults(reject_operations=[])
    for order_id, payment in [("o-done", "tok_visa"), ("o-undone", "tok_declined")]:
        new = new_order(order_id, payment_token=payment)
        placed = await site.api.call("POST", "/orders", site.tokens["shop"], new)
        assert placed.status in (201, 202), placed
    done, undone = await asyncio.wait_for(
        asyncio.gather(follow(site, "o-done"), follow(site, "o-undone")), 60
    )
    assert (done[-1], undone[-1]) == ("Completed", "Compensated"), (done, undone)


async def test_repeated_bad_tokens_from_one_client_get_429_while_others_still_get_in(
    site: Site,
) -> None:
    good = site.tokens["viewer"]
    assert (await site.api.call("GET", "/catalogue", good)).status == 200
    answers = [
        (await site.api.call("GET", "/catalogue", f"oft_guess-{n}")).status for n in range(21)
    ]
    assert answers[:20] == [401] * 20 and answers[20] == 429, answers
    refused = await site.api.call("GET", "/ops/stats", "oft_guess-again")
    assert refused.status == 429 and int(refused.headers["Retry-After"]) > 0, refused
    assert refused.body["detail"], refused
    # Its own token still works: the lock is on guessing, not on the address.
    assert (await site.api.call("GET", "/catalogue", good)).status == 200
    # Another client (another address) is not locked out, and is told its own 401s.
    connector = aiohttp.TCPConnector(local_addr=("127.0.0.2", 0))
    async with aiohttp.ClientSession(connector=connector) as other:
        for secret, expected in [(site.tokens["shop"], 200), ("oft_mine", 401)]:
            headers = {"Authorization": f"Bearer {secret}"}
            async with other.get(site.api.base + "/catalogue", headers=headers) as answer:
                assert answer.status == expected, (secret, answer.status)


# -- item 8: pages


async def test_no_page_loads_anything_from_another_origin_and_each_has_a_full_csp(
    site: Site,
) -> None:
    docs = await site.api.call("GET", "/docs")
    assert docs.status == 404, "Swagger UI from a CDN is not served"
    assert (await site.api.call("GET", "/openapi.json")).status == 200
    pages = ["/", "/console", "/static/common.js", "/static/style.css"]
    for path in pages:
        answer = await site.api.call("GET", path)
        assert answer.status == 200, path
        policy = dict(
            directive.strip().split(" ", 1)
            for directive in answer.headers["Content-Security-Policy"].split(";")
        )
        assert policy["default-src"] == "'self'", policy
        assert policy["base-uri"] == "'none'", policy
        assert policy["form-action"] == "'self'", policy
        assert policy["frame-ancestors"] == "'none'", policy
        for link in re.findall(r'(?:src|href)="([^"]*)"', str(answer.body)):
            assert link.startswith("/") and not link.startswith("//"), (path, link)
        assert not re.search(r"https?:", str(answer.body)), path
