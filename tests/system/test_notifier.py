"""Alerts delivered (issue 19): the real `orderflow serve notifier` on PostgreSQL and RabbitMQ,
delivering to a real local HTTP receiver that plays a generic webhook, Slack and PagerDuty.

Each target gets its own format once per alert (a duplicate notification is not sent again),
and PagerDuty hears of the alert's acknowledgement and resolution; a receiver that is down for
a while, then answers 503 and 429, gets every alert exactly once when it is back; a target that
refuses for good has its notices dead-lettered with the reason, and the others are unaffected;
a notifier killed mid-delivery and started again loses nothing.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aio_pika
import pytest
from aiohttp import web

from shared.broker.envelope import ERROR, REASON, TARGET
from shared.broker.publisher import Publisher
from shared.broker.rabbitmq import connect as connect_port
from shared.broker.rabbitmq.connection import connect
from shared.broker.topology import Names
from shared.domain.journal import Alert, AlertKind
from shared.domain.messages import AlertMessage
from shared.reporting import Reporter
from tests.conftest import RABBITMQ_URL
from tests.support.topology import Topology, free_port, running_topology
from tests.support.waiting import eventually

pytestmark = [pytest.mark.rabbitmq, pytest.mark.postgres]

PATHS = ("/hook", "/slack", "/pd")
SECRET = "s3cret-token"


@dataclass
class Receiver:
    """A local HTTP server playing the three targets. `answers[path]`: statuses to answer
    before 200s; `refuse`: paths that answer 400 for good; `hold`: paths whose requests wait
    until `release` is set. `taken` holds what it answered 2xx to, `seen` every request."""

    port: int = field(default_factory=free_port)
    answers: dict[str, list[int]] = field(default_factory=dict)
    refuse: set[str] = field(default_factory=set)
    hold: set[str] = field(default_factory=set)
    release: asyncio.Event = field(default_factory=asyncio.Event)
    taken: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    seen: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    runner: web.AppRunner | None = None

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.seen.append((request.path, body))
        if request.path in self.refuse:
            return web.json_response({"status": "invalid event"}, status=400)
        pending = self.answers.get(request.path)
        if pending:
            status = pending.pop(0)
            return web.Response(status=status, headers={"Retry-After": "1"}, text="later")
        if request.path in self.hold:
            await self.release.wait()
        self.taken.append((request.path, body))
        return web.json_response({"status": "success"}, status=202)

    async def start(self) -> None:
        app = web.Application()
        for path in PATHS:
            app.router.add_post(path, self.handle)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", self.port).start()

    async def stop(self) -> None:
        if self.runner is not None:
            self.release.set()
            await self.runner.cleanup()
            self.runner = None

    def env(self) -> dict[str, str]:
        base = f"http://127.0.0.1:{self.port}"
        return {
            "ORDERFLOW_NOTIFY_WEBHOOK_URL": f"{base}/hook?token={SECRET}",
            "ORDERFLOW_NOTIFY_SLACK_URL": f"{base}/slack",
            "ORDERFLOW_NOTIFY_PAGERDUTY_URL": f"{base}/pd",
            "ORDERFLOW_NOTIFY_PAGERDUTY_ROUTING_KEY": "rk-1",
            "ORDERFLOW_NOTIFY_RETRY_MAX_S": "0.5",
            "ORDERFLOW_NOTIFY_TIMEOUT_S": "5",
            "ORDERFLOW_NOTIFY_GIVE_UP_AFTER_S": "120",
            "ORDERFLOW_NOTIFY_POLL_S": "0.3",
        }

    def triggers(self) -> Counter[tuple[str, str]]:
        """(path, alert id) -> how many triggers of it were taken."""
        return Counter(
            (path, about(path, body)) for path, body in self.taken if is_trigger(path, body)
        )


def is_trigger(path: str, body: dict[str, Any]) -> bool:
    if path == "/pd":
        return bool(body["event_action"] == "trigger")
    if path == "/hook":
        return bool(body["event"] == "trigger")
    return not body["text"].startswith(("acknowledged", "resolved"))


def about(path: str, body: dict[str, Any]) -> str:
    """The alert a trigger is about."""
    if path == "/pd":
        return str(body["payload"]["custom_details"]["alert_id"])
    if path == "/hook":
        return str(body["alert"]["alert_id"])
    context = body["blocks"][1]["elements"][0]["text"]
    return str(
        next(p for p in context.split(" · ") if p.startswith("alert ")).removeprefix("alert ")
    )


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    r = Receiver()
    try:
        yield r
    finally:
        await r.stop()


@pytest.fixture
async def topo(hub: str, tmp_path: Path, receiver: Receiver) -> AsyncIterator[Topology]:
    async with running_topology(hub, tmp_path, **receiver.env()) as t:
        yield t


async def raise_alerts(topo: Topology, *ids: str, again: bool = False) -> list[Alert]:
    """Raise each alert as the processes do (stored, then published); with `again`, publish
    each stored one once more, as a second notification of the same alert."""
    names = Names(topo.hub)
    connection = await connect_port(RABBITMQ_URL, timeout=5, name="alert-raiser")
    try:
        publisher = await Publisher.open(connection, timeout=10)
        reporter = Reporter(topo.store, publisher, names, source="test")
        for alert_id in ids:
            await reporter.alert(
                AlertKind.ORDER_ERROR,
                f"order of {alert_id} in Error",
                alert_id=alert_id,
                order_id=f"o-{alert_id}",
            )
        stored = [a for a in await topo.store.list_alerts(limit=1000) if a.alert_id in ids]
        if again:
            for alert in stored:
                await publisher.publish(
                    AlertMessage(alert=alert),
                    exchange=names.alerts,
                    routing_key="",
                    message_id=f"alert:{alert.alert_id}:again",
                )
        return stored
    finally:
        await connection.close()


async def depth(queue: str) -> int:
    connection = await connect(RABBITMQ_URL, timeout=5, name="depth")
    try:
        declared = await (await connection.channel()).declare_queue(queue, passive=True)
        return int(declared.declaration_result.message_count or 0)
    finally:
        await connection.close()


async def all_taken(receiver: Receiver, ids: list[str], *, timeout: float = 90) -> None:
    async def done() -> bool:
        got = receiver.triggers()
        return all(got[(p, i)] >= 1 for p in PATHS for i in ids)

    await eventually(done, timeout=timeout, interval=0.2, what=f"{ids} at every target")


async def cli(topo: Topology, *args: str) -> subprocess.CompletedProcess[str]:
    """An `orderflow` command, run in a thread: the receiver answers on this event loop, and
    must not stall while the command runs (a target answering late is retried: a duplicate)."""
    return await asyncio.to_thread(topo.cli, *args)


async def stopped_with_the_feed_empty(topo: Topology) -> None:
    """Stop the notifier (it drains), then the feed holds nothing: every notification it took
    was acknowledged (one it held unacknowledged would be back on the queue)."""
    topo.signal("notifier", signal.SIGTERM)
    assert await asyncio.to_thread(topo.procs["notifier"].wait, 30) == 0
    assert await depth(Names(topo.hub).alert_feed) == 0


async def test_each_target_gets_its_format_once_and_hears_of_ack_and_resolve(
    topo: Topology, receiver: Receiver
) -> None:
    await receiver.start()
    topo.serve("notifier", "notifier")
    [alert] = await raise_alerts(topo, "a-1")
    await all_taken(receiver, ["a-1"])
    bodies = {path: body for path, body in receiver.taken}
    assert bodies["/hook"]["alert"] == alert.model_dump(mode="json")
    assert bodies["/hook"]["event"] == "trigger"
    dedup_key = f"{topo.hub}/order-error/order/o-a-1"
    assert bodies["/hook"]["dedup_key"] == dedup_key
    assert bodies["/slack"]["text"] == "[critical] order-error order o-a-1: order of a-1 in Error"
    assert bodies["/slack"]["blocks"][0]["text"]["text"] == bodies["/slack"]["text"]
    pd = bodies["/pd"]
    assert (pd["routing_key"], pd["event_action"], pd["dedup_key"]) == (
        "rk-1",
        "trigger",
        dedup_key,
    )
    assert pd["payload"]["summary"] == "order-error: order of a-1 in Error"
    assert (pd["payload"]["severity"], pd["payload"]["source"]) == ("critical", "test")
    assert pd["payload"]["timestamp"] == alert.at.isoformat()
    assert pd["payload"]["custom_details"]["order_id"] == "o-a-1"

    # The same alert notified once more: taken, and not sent again.
    await raise_alerts(topo, "a-1", again=True)

    async def found_sent() -> bool:
        return topo.logs("notifier").count('"event": "notice duplicate"') == 3

    await eventually(found_sent, timeout=30, what="the second notification found sent")

    acked = await cli(topo, "alerts", "ack", "a-1", "--by", "ann")
    assert acked.returncode == 0, acked.stderr
    assert acked.stdout.startswith("a-1 acknowledged by ann at "), acked.stdout

    def pd_events() -> list[tuple[str, str]]:
        return [(b["event_action"], b["dedup_key"]) for p, b in receiver.taken if p == "/pd"]

    async def pd_acknowledged() -> bool:
        return ("acknowledge", dedup_key) in pd_events()

    async def pd_resolved() -> bool:
        return ("resolve", dedup_key) in pd_events()

    await eventually(pd_acknowledged, timeout=30, what="PagerDuty's acknowledge")
    resolved = await cli(topo, "alerts", "resolve", "a-1", "--by", "bob")
    assert resolved.returncode == 0, resolved.stderr
    await eventually(pd_resolved, timeout=30, what="PagerDuty's resolve")
    # Slack and the webhook hear of them too, by whom.

    async def slack_heard() -> bool:
        texts = [b["text"] for p, b in receiver.taken if p == "/slack"]
        return any(t.startswith("resolved by bob") for t in texts)

    await eventually(slack_heard, timeout=30, what="Slack told of the resolution")
    listed = json.loads((await cli(topo, "alerts", "list", "--json")).stdout)["alerts"]
    assert [(a["acknowledged_by"], a["resolved_by"]) for a in listed] == [("ann", "bob")]
    table = await cli(topo, "alerts", "list")
    assert "resolved by bob" in table.stdout, table.stdout

    assert sorted(pd_events()) == sorted(
        [("trigger", dedup_key), ("acknowledge", dedup_key), ("resolve", dedup_key)]
    )
    assert receiver.triggers() == Counter({(p, "a-1"): 1 for p in PATHS})
    # Acknowledging again changes nothing; an unknown alert is an error that names it.
    again = await cli(topo, "alerts", "ack", "a-1", "nope", "--by", "carl")
    assert again.returncode != 0 and "no alert 'nope'" in again.stderr, again.stderr
    assert "a-1 acknowledged by ann" in again.stdout
    assert SECRET not in topo.logs("notifier")


async def test_a_receiver_down_for_a_while_gets_every_alert_once_when_it_is_back(
    topo: Topology, receiver: Receiver
) -> None:
    topo.serve("notifier", "notifier")
    ids = ["d-1", "d-2", "d-3"]
    await raise_alerts(topo, *ids)

    async def refused_a_while() -> bool:
        return topo.logs("notifier").count('"reason": "unreachable"') >= 6

    await eventually(refused_a_while, timeout=60, interval=0.3, what="deliveries refused")
    # Back, but busy for a while: 503s and a 429 (each with Retry-After: 1), then 2xx.
    receiver.answers = {"/hook": [503, 503], "/slack": [429, 503], "/pd": [503]}
    await receiver.start()
    await all_taken(receiver, ids)
    assert receiver.triggers() == Counter({(p, i): 1 for p in PATHS for i in ids})
    assert all(not pending for pending in receiver.answers.values()), "every 5xx/429 was seen"
    await stopped_with_the_feed_empty(topo)
    assert receiver.triggers() == Counter({(p, i): 1 for p in PATHS for i in ids})


async def test_a_target_refusing_for_good_gets_a_dead_letter_and_the_others_their_alerts(
    topo: Topology, receiver: Receiver
) -> None:
    receiver.refuse = {"/slack"}
    await receiver.start()
    topo.serve("notifier", "notifier")
    ids = ["r-1", "r-2"]
    await raise_alerts(topo, *ids)
    names = Names(topo.hub)

    async def both() -> bool:
        got = receiver.triggers()
        return all(got[(p, i)] == 1 for p in ("/hook", "/pd") for i in ids)

    await eventually(both, timeout=60, interval=0.2, what="the other targets' alerts")

    async def set_aside() -> bool:
        return await depth(names.alert_dead_letters) == 2

    await eventually(set_aside, timeout=30, interval=0.2, what="two dead letters")
    # The operator sees them, with why, and they stay where they are.
    listed = await cli(topo, "alerts", "undelivered", "--json")
    assert listed.returncode == 0, listed.stderr
    rows = json.loads(listed.stdout)["undelivered"]
    assert {(r["target"], r["reason"]) for r in rows} == {("slack", "refused")}
    assert sorted(r["message_id"] for r in rows) == [f"{i}/trigger/slack" for i in ids]
    assert all("answered 400" in r["error"] for r in rows)
    table = await cli(topo, "alerts", "undelivered")
    assert "2 notice(s) not delivered" in table.stdout and "refused" in table.stdout, table.stdout
    assert await depth(names.alert_dead_letters) == 2
    connection = await connect(RABBITMQ_URL, timeout=5, name="dlq-reader")
    try:
        channel = await connection.channel()
        queue = await channel.declare_queue(names.alert_dead_letters, passive=True)
        letters: list[aio_pika.abc.AbstractIncomingMessage] = []
        while (message := await queue.get(no_ack=False, fail=False)) is not None:
            letters.append(message)
        for letter in letters:
            headers = letter.headers or {}
            assert headers[REASON] == "refused" and headers[TARGET] == "slack"
            assert "answered 400" in str(headers[ERROR]) and "invalid event" in str(headers[ERROR])
        assert sorted(json.loads(m.body)["alert"]["alert_id"] for m in letters) == ids
    finally:
        await connection.close()
    await stopped_with_the_feed_empty(topo)
    assert sum(p == "/slack" for p, _ in receiver.seen) == 2, "a refusal is never tried again"


async def test_a_notifier_killed_mid_delivery_and_started_again_loses_nothing(
    topo: Topology, receiver: Receiver
) -> None:
    receiver.hold = {"/hook"}
    await receiver.start()
    topo.serve("notifier", "notifier")
    ids = ["k-1", "k-2"]
    await raise_alerts(topo, *ids)

    async def in_flight() -> bool:
        return any(p == "/hook" for p, _ in receiver.seen)

    await eventually(in_flight, timeout=60, interval=0.1, what="a delivery in flight")

    async def others_done() -> bool:
        # Logged once marked done in the inbox: what the kill must not make it send again.
        lines = [ln for ln in topo.logs("notifier").splitlines() if "notice delivered" in ln]
        return sum('"target": "webhook"' not in ln for ln in lines) == 2 * len(ids)

    await eventually(others_done, timeout=60, interval=0.1, what="Slack and PagerDuty done")
    topo.kill("notifier")
    receiver.release.set()  # what the held requests said is now too late for the dead notifier
    topo.serve("notifier", "notifier")

    def second_run() -> list[dict[str, Any]]:
        lines = topo.logs("notifier").split('"event": "delivering alerts"')
        later = lines[2] if len(lines) > 2 else ""
        found = [json.loads("{" + line.split("{", 1)[1]) for line in later.splitlines()[1:]]
        return [f for f in found if str(f.get("event", "")).startswith("notice ")]

    async def finished_again() -> bool:
        done = {(f["target"], f["alert_id"]) for f in second_run()}
        return done >= {(t, i) for t in ("webhook", "slack", "pagerduty") for i in ids}

    # Every notification the killed notifier held came back to the one started again.
    await eventually(finished_again, timeout=90, interval=0.2, what="the restarted notifier")
    await all_taken(receiver, ids)
    await stopped_with_the_feed_empty(topo)
    outcomes = {(f["target"], f["alert_id"]): f["event"] for f in second_run()}
    assert all(outcomes[(t, i)] == "notice duplicate" for t in ("slack", "pagerduty") for i in ids)
    got = receiver.triggers()
    # Nothing lost; sent again only what was in flight at the kill (at least once, and once
    # per target for everything it had finished).
    assert all(got[(p, i)] >= 1 for p in PATHS for i in ids)
    assert all(got[(p, i)] == 1 for p in ("/slack", "/pd") for i in ids), got
    assert all(got[("/hook", i)] <= 2 for i in ids), got


def test_without_a_target_or_with_a_bad_one_the_notifier_refuses_to_start() -> None:
    """A configuration error (exit 2, one line naming the settings), before any server is asked
    (the broker URL here leads nowhere)."""
    env = os.environ | {"ORDERFLOW_RABBITMQ_URL": "amqp://u:p@127.0.0.1:1/"}
    env = {k: v for k, v in env.items() if not k.startswith("ORDERFLOW_NOTIFY_")}
    done = subprocess.run(
        [sys.executable, "-m", "services.cli", "serve", "notifier"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert done.returncode == 2 and "ORDERFLOW_NOTIFY_WEBHOOK_URL" in done.stderr, done.stderr
    bad = env | {"ORDERFLOW_NOTIFY_SLACK_URL": f"hooks.example/{SECRET}"}
    done = subprocess.run(
        [sys.executable, "-m", "services.cli", "serve", "notifier"],
        capture_output=True,
        text=True,
        timeout=60,
        env=bad,
    )
    assert done.returncode == 2 and "ORDERFLOW_NOTIFY_SLACK_URL" in done.stderr, done.stderr
    assert SECRET not in done.stderr + done.stdout


async def test_a_burst_delivers_what_the_feed_holds_and_exits(
    topo: Topology, receiver: Receiver
) -> None:
    await receiver.start()
    ids = ["b-1", "b-2"]
    await raise_alerts(topo, *ids)
    burst = await cli(topo, "serve", "notifier", "--burst")
    assert burst.returncode == 0, burst.stderr[-2000:]
    assert receiver.triggers() == Counter({(p, i): 1 for p in PATHS for i in ids})
    assert await depth(Names(topo.hub).alert_feed) == 0
