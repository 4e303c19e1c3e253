"""Issue 33, items 3-5 (leaks), each attack run as the user it comes from, on one system.

The system: the generated definitions in a scratch vhost, every process under its own broker
user (the notifier too, sending to a local receiver that plays a webhook, Slack and PagerDuty),
the API as an application's user with the operator's for the dead letters, real tokens.

- As an application's broker user: a message whose `schema_version` is "4111 1111 1111 1111",
  one whose message id is a card number, and an order with one in its customer id. Neither the
  alerts (text and id: as stored, as `alerts list` and `/ops/alerts` show them), nor a line of
  any process's log, nor the dead-letter list (`dlq list --json` as the operator, the API's as a
  viewer), nor a body the notifier sent, holds a card number in clear (item 3); the order is
  dead-lettered `invalid`, naming the field (item 4).
- As a shop token: an order with a card number in its customer id, or in an address line, is
  refused with a 422 naming the field, and the answer does not echo it (item 4).
- As a viewer token: `/ops/order` shows the payment token by its start only (item 5).

The module runs the system once (CI time), in an event loop of its own; each test reads what
the run left. The searches over every field and every output are tests/unit/
test_leak_properties.py.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from shared.broker.port import Outgoing
from shared.broker.publisher import Publisher
from shared.broker.rabbitmq import connect
from shared.broker.topology import Names
from tests.support.api import Answer, ApiClient, start_api, token
from tests.support.cards import in_clear
from tests.support.factories import order_data
from tests.support.topology import Topology, free_port, running_topology
from tests.support.vhost import scratch_vhost, serve_each_under_its_own_user
from tests.support.waiting import eventually

pytestmark = [pytest.mark.rabbitmq, pytest.mark.postgres]

SCHEMA_CARD = "4111 1111 1111 1111"
"""The issue's: a message's `schema_version`."""
ID_CARD = "4000056655665556"
"""A message id."""
CUSTOMER_CARD = "5555555555554444"
"""An order's customer id, through the queue and through the API."""
LINE_CARD = "3782 822463 10005"
"""An order's address line, through the API."""
SKU_CARD = "4222222222222"
"""A product code that passes the Luhn check (a 13-digit test card number, shaped as a GTIN)."""
CARDS = tuple(
    c.replace(" ", "") for c in (SCHEMA_CARD, ID_CARD, CUSTOMER_CARD, LINE_CARD, SKU_CARD)
)
PATHS = ("/hook", "/slack", "/pd")
TOKEN = "tok_4242abcdef987654"


def cards_in(text: str) -> list[str]:
    """The attack's card numbers that `text` shows in clear (in any grouping)."""
    return [card for card in CARDS if in_clear(card, text)]


@dataclass
class Receiver:
    """The notifier's three targets: every body it was sent, by path."""

    port: int = field(default_factory=free_port)
    bodies: list[tuple[str, Any]] = field(default_factory=list)
    runner: web.AppRunner | None = None

    async def take(self, request: web.Request) -> web.Response:
        self.bodies.append((request.path, await request.json()))
        return web.json_response({"status": "success"}, status=202)

    async def start(self) -> None:
        app = web.Application()
        for path in PATHS:
            app.router.add_post(path, self.take)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", self.port).start()

    def env(self) -> dict[str, str]:
        base = f"http://127.0.0.1:{self.port}"
        return {
            "ORDERFLOW_NOTIFY_WEBHOOK_URL": f"{base}/hook",
            "ORDERFLOW_NOTIFY_SLACK_URL": f"{base}/slack",
            "ORDERFLOW_NOTIFY_PAGERDUTY_URL": f"{base}/pd",
            "ORDERFLOW_NOTIFY_PAGERDUTY_ROUTING_KEY": "rk-1",
            "ORDERFLOW_NOTIFY_POLL_S": "0.3",
        }


@dataclass
class Run:
    """What the attacks left: the outputs each test reads."""

    hub: str = ""
    app: str = ""
    alerts: list[dict[str, Any]] = field(default_factory=list)
    """As stored."""
    shown: dict[str, str] = field(default_factory=dict)
    """What each way of looking showed: a command's output or an API answer, as text."""
    logs: dict[str, str] = field(default_factory=dict)
    sent: list[tuple[str, Any]] = field(default_factory=list)
    letters: list[dict[str, Any]] = field(default_factory=list)
    """`dlq list --json` as the operator."""
    refused: dict[str, Answer] = field(default_factory=dict)
    """The shop's orders with a card number, by the field that held it."""
    recorded_by_queue: bool = False
    """Whether the order with a card number in its customer id was recorded."""
    order_as_viewed: dict[str, Any] = field(default_factory=dict)
    found_by_mark: bool = False
    """Whether `dlq show` found the letter whose id is a card number by the id it is listed by."""


async def _publish_attacks(url: str, names: Names) -> None:
    """As an application's broker user, below the publisher's validation (which refuses them)."""
    connection = await connect(url, timeout=5, name="leak-attacks")
    try:
        publisher = await Publisher.open(connection, timeout=10)
        bad = order_data("o-card").model_dump(mode="json") | {"customer_id": CUSTOMER_CARD}
        for message_id, body in [
            ("m-schema", {"schema_version": SCHEMA_CARD, "order": bad}),
            (ID_CARD, {"schema_version": 1}),
            ("m-customer", {"schema_version": 1, "order": bad}),
        ]:
            message = Outgoing(
                json.dumps(body).encode(), message_id=message_id, type="order.submit"
            )
            await publisher.publish_raw(message, exchange=names.submit, routing_key=names.orders)
    finally:
        await connection.close()


async def _run(workdir: Path) -> Run:
    run = Run(hub=f"t{uuid.uuid4().hex[:12]}")
    receiver = Receiver()
    await receiver.start()
    try:
        async with scratch_vhost(run.hub) as broker:
            run.app = app = broker.apps[0]
            env = receiver.env() | {"ORDERFLOW_POISON_ALERT_WINDOW_S": "0"}
            async with running_topology(
                run.hub, workdir, ORDERFLOW_RABBITMQ_URL=broker.url("admin"), **env
            ) as topo:
                serve_each_under_its_own_user(topo, broker)
                topo.serve("notifier", "notifier", ORDERFLOW_RABBITMQ_URL=broker.url("notifier"))
                # The API and the tokens get ready while the attacks through the queue run.
                api_ready = asyncio.create_task(
                    start_api(
                        topo,
                        ORDERFLOW_RABBITMQ_URL=broker.url(broker.apps[1]),
                        ORDERFLOW_API_RABBITMQ_URL=broker.url("api"),
                    )
                )
                tokens = asyncio.gather(
                    asyncio.to_thread(token, topo, "shop", "acme"),
                    asyncio.to_thread(token, topo, "viewer", "vera"),
                )
                operator = {"ORDERFLOW_RABBITMQ_URL": broker.url("operator")}
                await _publish_attacks(broker.url(app), Names(run.hub))
                await _wait_for_the_attacks(topo, run, receiver)
                api = await api_ready
                try:
                    await _through_the_api(run, api, *await tokens)
                finally:
                    await api.close()
                await _look(topo, run, operator)
                labels = list(topo.procs)
            # The processes have stopped, and written their last lines.
            run.logs = {label: topo.logs(label) for label in labels}
    finally:
        if receiver.runner is not None:
            await receiver.runner.cleanup()
    run.sent = receiver.bodies
    return run


async def _wait_for_the_attacks(topo: Topology, run: Run, receiver: Receiver) -> None:
    """Until the bad messages are handled (each a dead letter with its poison alert, but the
    order with a card number, which may have been recorded), and each alert sent to every
    target."""

    async def handled() -> bool:
        run.recorded_by_queue = await topo.store.get_order(f"{run.app}/o-card") is not None
        run.alerts = [a.model_dump(mode="json") for a in await topo.store.list_alerts(limit=100)]
        poison = [a for a in run.alerts if a["kind"] == "poison-message"]
        paths = [path for path, body in receiver.bodies]
        expected = 2 if run.recorded_by_queue else 3
        return len(poison) >= expected and all(paths.count(p) >= expected for p in PATHS)

    await eventually(handled, timeout=60, interval=0.3, what="the attacks handled and told")


async def _through_the_api(run: Run, api: ApiClient, shop: str, viewer: str) -> None:
    good = order_data("o-token", payment_token=TOKEN).model_dump(mode="json")
    address = good["shipping_address"]
    for where, order in [
        ("customer_id", good | {"order_id": "o-c", "customer_id": CUSTOMER_CARD}),
        ("line1", good | {"order_id": "o-l", "shipping_address": address | {"line1": LINE_CARD}}),
    ]:
        run.refused[where] = await api.call("POST", "/orders", shop, order)
    # A product code may pass the Luhn check (1 in 10 GTINs does): taken, and shown masked.
    good["lines"][0]["sku"] = SKU_CARD
    placed = await api.call("POST", "/orders", shop, good)
    assert placed.status == 201, placed
    seen_by_shop = await api.call("GET", "/orders/o-token", shop)
    run.shown["/orders/o-token (shop)"] = json.dumps(seen_by_shop.body)
    streamed = [data async for _, data in api.events("/orders/o-token/events", shop)]
    run.shown["/orders/o-token/events (shop)"] = json.dumps(streamed)
    orders = (await api.call("GET", "/ops/orders", viewer)).body["orders"]
    [order_id] = [o["order_id"] for o in orders if o["order_id"].endswith("acme.o-token")]
    seen = await api.call("GET", "/ops/order", viewer, order_id=order_id)
    assert seen.status == 200, seen
    run.order_as_viewed = seen.body["order"]
    for path, params in [
        ("/ops/alerts", {}),
        ("/ops/dead-letters", {}),
        ("/ops/dead-letter", {"message_id": ID_CARD}),
        ("/ops/order", {"order_id": order_id}),
    ]:
        answer = await api.call("GET", path, viewer, **params)
        assert answer.status == 200, (path, answer)
        run.shown[f"{path} (viewer)"] = json.dumps(answer.body)
    run.shown["refusals (shop)"] = json.dumps([a.body for a in run.refused.values()])


async def _look(topo: Topology, run: Run, operator: dict[str, str]) -> None:
    """The operator's commands, as the operator's broker user, one at a time: a listing holds
    the letters it reads until it gives them back, so a second listing beside it would miss
    them (what it saw hid nothing, but it did not see everything)."""
    commands = [("dlq", "list", "--json"), ("dlq", "list"), ("alerts", "list", "--json")]
    done = [await asyncio.to_thread(partial(topo.cli, *args, **operator)) for args in commands]
    for args, result in zip(commands, done, strict=True):
        assert result.returncode == 0, result.stderr
        run.shown[" ".join(args) + " (operator)"] = result.stdout + result.stderr
    run.letters = json.loads(done[0].stdout)["messages"]
    # The letter whose id is a card number is listed by its mark, and found by it.
    [marked] = [r["message_id"] for r in run.letters if "redacted card number" in r["message_id"]]
    shown = await asyncio.to_thread(partial(topo.cli, "dlq", "show", marked, "--json", **operator))
    run.shown["dlq show <mark> (operator)"] = shown.stdout + shown.stderr
    run.found_by_mark = shown.returncode == 0 and bool(json.loads(shown.stdout)["messages"])


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    """The module's one run, in an event loop of its own: the tests only read what it left."""
    return asyncio.run(_run(tmp_path_factory.mktemp("leaks")))


# -- item 3: card numbers in alerts, logs, webhooks, answers and command output


def test_no_alert_holds_a_card_number_in_its_text_or_its_id(run: Run) -> None:
    poison = [a for a in run.alerts if a["kind"] == "poison-message"]
    assert len(poison) >= 2, run.alerts
    leaked = {a["alert_id"]: found for a in run.alerts if (found := cards_in(json.dumps(a)))}
    assert not leaked, leaked
    # The message id that is a card number names its alert by a stable mark.
    ids = [a["alert_id"] for a in poison]
    assert any(i.startswith(f"poison:{run.hub}.orders:[redacted card number #") for i in ids), ids


def test_no_process_logs_a_card_number(run: Run) -> None:
    assert {"submission", "notifier", "api", "scheduler-1"} <= set(run.logs)
    leaked = {
        label: [line for line in log.splitlines() if cards_in(line)]
        for label, log in run.logs.items()
    }
    assert not any(leaked.values()), {k: v[:3] for k, v in leaked.items() if v}
    assert '"alert raised"' in run.logs["submission"]


def test_the_dead_letter_list_shows_no_card_number(run: Run) -> None:
    assert len(run.letters) >= 2
    assert run.found_by_mark, run.shown["dlq show <mark> (operator)"]
    leaked = {name: found for name, text in run.shown.items() if (found := cards_in(text))}
    assert not leaked, leaked


def test_no_notice_the_notifier_sends_holds_a_card_number(run: Run) -> None:
    assert {path for path, _ in run.sent} == set(PATHS)
    leaked = [(path, body) for path, body in run.sent if cards_in(json.dumps(body))]
    assert not leaked, leaked[:3]


# -- item 4: card numbers refused in an order's free text


def test_a_shop_cannot_place_an_order_with_a_card_number_in_its_free_text(run: Run) -> None:
    for where, answer in run.refused.items():
        assert answer.status == 422, (where, answer)
        locations = [error["loc"][-1] for error in answer.body["detail"]]
        assert locations == [where], answer.body
        assert "card number" in answer.body["detail"][0]["msg"]
        assert not cards_in(json.dumps(answer.body)), answer.body


def test_the_same_order_through_the_queue_is_dead_lettered_invalid(run: Run) -> None:
    assert not run.recorded_by_queue
    [letter] = [r for r in run.letters if r["message_id"] == "m-customer"]
    assert letter["reason"] == "invalid"
    assert letter["error"].startswith("order.customer_id: "), letter


# -- item 5: a viewer sees the payment token by its start only


def test_a_viewer_sees_the_payment_token_shortened(run: Run) -> None:
    assert run.order_as_viewed["payment_token"] == "tok_4242…"
    assert TOKEN not in run.shown["/ops/order (viewer)"]
