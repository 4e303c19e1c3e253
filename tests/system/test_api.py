"""The HTTP API through real processes: `serve api` beside the whole topology, on PostgreSQL and
RabbitMQ, called over real HTTP with tokens made by the real CLI. Every endpoint, every role,
idempotent order creation and its 409, cancellation in each state, the live stream."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aio_pika
import pytest

from shared.broker.rabbitmq.connection import connect
from shared.broker.topology import Names
from shared.domain.journal import HistoryEventType
from shared.domain.states import ProcessState
from tests.conftest import RABBITMQ_URL, RABBITMQ_USER
from tests.support.api import ApiClient, start_api, token
from tests.support.factories import order_data
from tests.support.topology import Topology, running_topology
from tests.support.waiting import eventually

pytestmark = [pytest.mark.rabbitmq, pytest.mark.postgres]


def new_order(order_id: str, **overrides: Any) -> dict[str, Any]:
    return order_data(order_id, **overrides).model_dump(mode="json")


@pytest.fixture
async def topo(hub: str, tmp_path: Path) -> AsyncIterator[Topology]:
    async with running_topology(hub, tmp_path) as t:
        yield t


@pytest.fixture
async def api(topo: Topology) -> AsyncIterator[ApiClient]:
    client = await start_api(topo)
    try:
        yield client
    finally:
        await client.close()


async def _until(api: ApiClient, shop: str, order_id: str, *statuses: str) -> dict[str, Any]:
    async def reached() -> dict[str, Any] | None:
        answer = await api.call("GET", f"/orders/{order_id}", shop)
        return answer.body if answer.status == 200 and answer.body["status"] in statuses else None

    found: dict[str, Any] = await eventually(reached, timeout=60, what=f"{order_id} {statuses}")
    return found


async def test_tokens_and_roles_gate_every_endpoint_with_no_side_effect(
    topo: Topology, api: ApiClient
) -> None:
    await topo.start_all()
    shop, viewer, operator = (
        token(topo, "shop", "acme"),
        token(topo, "viewer", "vera"),
        token(topo, "operator", "otto"),
    )
    order = new_order("o-gate")
    endpoints = [
        ("GET", "/catalogue", None),
        ("POST", "/orders", order),
        ("GET", "/orders/o-gate", None),
        ("GET", "/orders/o-gate/events", None),
        ("POST", "/orders/o-gate/cancel", None),
        ("GET", "/ops/orders", None),
        ("GET", "/ops/stats", None),
        ("POST", "/ops/resubmit", {"dry_run": False}),
    ]
    for method, path, body in endpoints:
        for bad in (None, "oft_not-a-token"):
            answer = await api.call(method, path, bad, body)
            assert answer.status == 401, (method, path, answer)
            assert answer.headers["WWW-Authenticate"].startswith("Bearer")
            assert answer.body["detail"]
    # A wrong role is a 403, and changes nothing.
    for who in (viewer, operator):
        answer = await api.call("POST", "/orders", who, order)
        assert answer.status == 403 and "role shop" in answer.body["detail"], answer
    for method, path, body in [("GET", "/ops/orders", None), ("POST", "/ops/resubmit", {})]:
        assert (await api.call(method, path, shop, body)).status == 403
    resubmit = await api.call("POST", "/ops/resubmit", viewer, {"dry_run": False})
    assert resubmit.status == 403
    assert await topo.store.get_order("acme.o-gate") is None, "a refused request wrote nothing"
    # Revoked: refused from the next request on.
    assert (await api.call("GET", "/catalogue", viewer)).status == 200
    assert topo.cli("tokens", "revoke", "vera").returncode == 0
    assert (await api.call("GET", "/catalogue", viewer)).status == 401


async def test_placing_is_idempotent_by_id_a_conflict_is_409_and_shops_are_apart(
    topo: Topology, api: ApiClient
) -> None:
    await topo.start_all()
    acme, other = token(topo, "shop", "acme"), token(topo, "shop", "other")
    placed = await api.call("POST", "/orders", acme, new_order("o-1"))
    assert placed.status == 201, placed
    assert placed.body["recorded"] and placed.headers["Location"] == "/orders/o-1"
    assert placed.body["order"]["order_id"] == "o-1"
    again = await api.call("POST", "/orders", acme, new_order("o-1"))
    assert again.status == 200 and again.body["order_id"] == "o-1", again
    conflict = await api.call("POST", "/orders", acme, new_order("o-1", customer_id="c-other"))
    assert conflict.status == 409 and "other data" in conflict.body["detail"], conflict
    done = await _until(api, acme, "o-1", "Completed")
    assert [s["status"] for s in done["steps"]] == ["Completed"] * 3
    assert done["process_state"] == "Processed" and not done["cancellable"]
    assert "payment_token" not in str(done)
    stored = await topo.store.get_order("acme.o-1")
    assert stored is not None and stored.data.customer_id == "c-42", "nothing was overwritten"
    # Another shop neither sees acme's order nor collides with its id.
    assert (await api.call("GET", "/orders/o-1", other)).status == 404
    assert (await api.call("POST", "/orders/o-1/cancel", other)).status == 404
    theirs = await api.call("POST", "/orders", other, new_order("o-1", customer_id="c-7"))
    assert theirs.status == 201, theirs
    audit = await topo.audit()
    assert audit["ok"], audit["violations"]


async def test_bad_input_of_every_kind_is_a_4xx_with_a_clear_message(
    topo: Topology, api: ApiClient
) -> None:
    await topo.start_all()
    acme, operator = token(topo, "shop", "acme"), token(topo, "operator", "otto")
    good = new_order("o-bad")
    cases: list[tuple[str, str, Any, dict[str, Any]]] = [
        ("POST", "/orders", None, {}),
        ("POST", "/orders", {**good, "order_id": "x" * 41}, {}),
        ("POST", "/orders", {**good, "order_id": "has/slash"}, {}),
        ("POST", "/orders", {**good, "lines": []}, {}),
        ("POST", "/orders", {**good, "lines": [{"sku": "a", "quantity": 0}]}, {}),
        ("POST", "/orders", {**good, "payment_token": "4242424242424242"}, {}),
        ("POST", "/orders", {**good, "surprise": 1}, {}),
        ("POST", "/orders", [good], {}),
        ("GET", "/orders/%E2%80%AE", None, {}),
    ]
    for method, path, body, params in cases:
        answer = await api.call(method, path, acme, body, **params)
        assert answer.status == 422, (path, body, answer)
        assert answer.body["detail"], answer
    for path, params in [
        ("/ops/orders", {"state": "Nope"}),
        ("/ops/orders", {"limit": "0"}),
        ("/ops/orders", {"older_than": "yesterday"}),
        ("/ops/orders", {"cursor": "not a cursor"}),
        ("/ops/alerts", {"since": "2026-01-01T00:00:00"}),
        ("/ops/dead-letters", {"queue": "nowhere"}),
    ]:
        answer = await api.call("GET", path, operator, **params)
        assert answer.status in (400, 422), (path, params, answer)
        assert answer.body["detail"], answer
    assert (await topo.counts()) == {s: 0 for s in ProcessState} or not any(
        (await topo.counts()).values()
    )


async def test_the_stream_tells_each_change_until_the_order_is_final(
    topo: Topology, api: ApiClient
) -> None:
    await topo.start_all()
    acme = token(topo, "shop", "acme")
    placed = await api.call("POST", "/orders", acme, new_order("o-live"))
    assert placed.status == 201
    seen = [data["status"] async for name, data in api.events("/orders/o-live/events", acme)]
    assert seen[-1] == "Completed", seen
    assert len(seen) == len(set(seen)) or seen, "each event is a change"
    assert (await api.call("GET", "/orders/nope/events", acme)).status == 404


async def test_cancel_in_each_state(topo: Topology, api: ApiClient) -> None:
    await topo.start_all(schedulers=0)  # nothing claims: orders stay Pending
    acme = token(topo, "shop", "acme")
    assert (await api.call("POST", "/orders", acme, new_order("o-pending"))).status == 201
    cancelled = await api.call("POST", "/orders/o-pending/cancel", acme)
    assert cancelled.status == 200, cancelled
    assert cancelled.body["outcome"] == "Cancelled"
    assert cancelled.body["order"]["status"] == "Cancelled"
    [event] = await topo.history("acme.o-pending", HistoryEventType.CANCELLED)
    assert event.data["by"] == "acme", "the token's name is who asked"
    again = await api.call("POST", "/orders/o-pending/cancel", acme)
    assert again.status == 409 and "Cancelled already" in again.body["detail"]

    # Processing, a step hanging inside the remote service: fenced out, then compensated.
    await topo.remote.set_faults(hang_rate=1.0, hang_s=8.0)
    topo.serve("scheduler-1", "scheduler")
    assert (await api.call("POST", "/orders", acme, new_order("o-hang"))).status in (201, 202)

    async def step_sent() -> bool:
        state = await topo.store.get_state("acme.o-hang")
        return state is not None and any(s.attempts for s in state.steps.values())

    await eventually(step_sent, timeout=30, what="a step sent")
    answer = await api.call("POST", "/orders/o-hang/cancel", acme)
    assert answer.status == 200 and answer.body["outcome"] == "Compensating", answer
    await topo.remote.set_faults(hang_rate=0.0)
    final = await _until(api, acme, "o-hang", "Compensated")
    assert final["error"] == "cancelled by acme"

    # Processed: refused with the reason.
    assert (await api.call("POST", "/orders", acme, new_order("o-done"))).status in (201, 202)
    await _until(api, acme, "o-done", "Completed")
    refused = await api.call("POST", "/orders/o-done/cancel", acme)
    assert refused.status == 409 and "Processed" in refused.body["detail"], refused
    audit = await topo.audit()
    assert audit["ok"], audit["violations"]


async def test_operator_endpoints_do_what_the_cli_does_as_the_token_s_holder(
    topo: Topology, api: ApiClient
) -> None:
    topo.env = topo.env | {"ORDERFLOW_FAILURE_THRESHOLD": "2"}
    await topo.start_all(ORDERFLOW_REMOTE_OUTAGE="true")
    acme, viewer, operator = (
        token(topo, "shop", "acme"),
        token(topo, "viewer", "vera"),
        token(topo, "operator", "otto"),
    )
    for n in range(3):
        assert (await api.call("POST", "/orders", acme, new_order(f"o-{n}"))).status in (201, 202)

    await topo.wait_count(ProcessState.ERROR, 3)  # parked by the outage
    listed = await api.call("GET", "/ops/orders", viewer, state="Error", limit=2)
    assert listed.status == 200 and len(listed.body["orders"]) == 2 and listed.body["next"]
    rest = await api.call("GET", "/ops/orders", viewer, state="Error", cursor=listed.body["next"])
    assert len(rest.body["orders"]) == 1
    groups = (await api.call("GET", "/ops/failures", viewer)).body["groups"]
    assert sum(g["count"] for g in groups) == 3
    shown = await api.call("GET", "/ops/order", viewer, order_id="acme.o-0")
    assert shown.status == 200 and shown.body["state"]["process_state"] == "Error"
    history = await api.call("GET", "/ops/order/history", viewer, order_id="acme.o-0")
    assert history.body["events"][0]["event"] == "OrderSubmitted"
    assert (await api.call("GET", "/ops/order", viewer, order_id="acme.nope")).status == 404
    assert (await api.call("POST", "/ops/order/resubmit", viewer, {}, order_id="x")).status == 403

    # One group: a dry run first (changes nothing), then the job, then the orders complete.
    group = max(groups, key=lambda g: g["count"])
    body = {"error_kind": group["error_kind"], "fingerprint": group["fingerprint"]}
    dry = await api.call("POST", "/ops/resubmit", operator, body)
    assert dry.status == 200 and dry.body["finished"], dry
    assert dry.body["changed"] == group["count"] and {
        o["outcome"] for o in dry.body["outcomes"]
    } == {"would go Error -> Pending"}
    assert (await topo.counts())[ProcessState.ERROR] == 3
    await topo.remote.set_faults(outage=False)
    first = await api.call(
        "POST", "/ops/order/resubmit", operator, {}, order_id=dry.body["outcomes"][0]["order_id"]
    )
    assert first.status == 200 and first.body["outcome"] == "Error -> Pending", first
    real = body | {"dry_run": False, "rate": 50, "selected": dry.body["selected"]}
    job = await api.call("POST", "/ops/resubmit", operator, real)
    assert job.status == 200 and job.body["job_id"], job

    async def finished() -> dict[str, Any] | None:
        seen = await api.call("GET", f"/ops/jobs/{job.body['job_id']}", viewer)
        return seen.body if seen.body["finished"] else None

    report = await eventually(finished, timeout=30, what="the bulk resubmission")
    assert report["refused"] == 1, "the order resubmitted on its own since the dry run"
    [refusal] = [o for o in report["outcomes"] if o["refused"]]
    assert refusal["order_id"] == first.body["order_id"]
    assert "changed since it was selected" in refusal["outcome"]
    assert report["changed"] == group["count"] - 1
    # The other groups' orders, if any: every order in Error, without a dry run.
    rest_job = await api.call("POST", "/ops/resubmit", operator, {"dry_run": False, "rate": 50})
    assert rest_job.status == 200 and rest_job.body["total"] == 3 - group["count"], rest_job
    await topo.wait_count(ProcessState.PROCESSED, 3)
    events = await topo.history(first.body["order_id"], HistoryEventType.RESUBMITTED)
    assert events[0].data["by"] == "otto"

    stats = await api.call("GET", "/ops/stats", viewer)
    assert stats.body["by_state"]["Processed"] == 3 and stats.body["queues"]
    running = (await api.call("GET", "/ops/processes", viewer)).body
    assert set(running) == {"processes", "open_breakers", "leader", "intake"}, running
    assert running["leader"] and isinstance(running["open_breakers"], list)
    assert {"scheduler", "supervisor"} <= {p["kind"] for p in running["processes"]}
    assert {c["process"] for c in running["intake"]} <= {p["name"] for p in running["processes"]}
    alerts = await api.call("GET", "/ops/alerts", viewer)
    assert {a["kind"] for a in alerts.body["alerts"]} >= {"order-error"}
    # Acknowledged and resolved as the token's holder (`alerts ack|resolve`), the first standing.
    alert_id = alerts.body["alerts"][0]["alert_id"]
    ack = "/ops/alert/acknowledge"
    assert (await api.call("POST", ack, viewer, alert_id=alert_id)).status == 403
    assert (await api.call("POST", ack, operator, alert_id="nope")).status == 404
    acked = await api.call("POST", ack, operator, alert_id=alert_id)
    assert acked.status == 200 and acked.body["acknowledged_by"] == "otto", acked
    resolved = await api.call("POST", "/ops/alert/resolve", operator, alert_id=alert_id)
    assert resolved.body["resolved_by"] == "otto" and resolved.body["acknowledged_by"] == "otto"
    again = await api.call("GET", "/ops/alerts", viewer)
    [shown] = [a for a in again.body["alerts"] if a["alert_id"] == alert_id]
    assert (shown["acknowledged_by"], shown["resolved_by"]) == ("otto", "otto")
    compensate = await api.call("POST", "/ops/order/compensate", operator, order_id="acme.o-1")
    assert compensate.status == 409 and "refused" in compensate.body["detail"]
    audit = await topo.audit()
    assert audit["ok"], audit["violations"]


async def test_dead_letters_are_listed_shown_replayed_and_purged_over_http(
    topo: Topology, api: ApiClient
) -> None:
    await topo.start_all()
    viewer, operator = token(topo, "viewer", "vera"), token(topo, "operator", "otto")
    names = Names(topo.hub)
    connection = await connect(RABBITMQ_URL, timeout=5, name="api-dlq-test")
    try:
        channel = await connection.channel()
        for n in (1, 2):
            poison = aio_pika.Message(
                b"{not json", message_id=f"p-{n}", type="order.submit", user_id=RABBITMQ_USER
            )
            await channel.default_exchange.publish(poison, routing_key=names.orders)

        async def both() -> list[dict[str, Any]] | None:
            rows = (await api.call("GET", "/ops/dead-letters", viewer)).body["messages"]
            return rows if len(rows) == 2 else None

        rows = await eventually(both, timeout=30, what="two dead letters")
        assert {(r["message_id"], r["reason"]) for r in rows} == {
            ("p-1", "malformed"),
            ("p-2", "malformed"),
        }
        shown = await api.call("GET", "/ops/dead-letter", viewer, message_id="p-1", queue="orders")
        [letter] = shown.body["messages"]
        assert (letter["reason"], letter["body"]) == ("malformed", "{not json")
        assert (await api.call("GET", "/ops/dead-letter", viewer, message_id="nope")).status == 404
        # A viewer reads; only an operator replays or purges.
        body = {"message_ids": ["p-1"]}
        assert (await api.call("POST", "/ops/dead-letters/replay", viewer, body)).status == 403
        replayed = await api.call("POST", "/ops/dead-letters/replay", operator, body)
        assert replayed.status == 200 and replayed.body["replayed"] == [
            {"message_id": "p-1", "queue": names.orders}
        ], replayed
        # Replayed as it was: still malformed, so dead-lettered again at its first delivery.
        await eventually(both, timeout=30, what="the replayed letter back in the DLQ")
        purge = await api.call("DELETE", "/ops/dead-letters", operator, queue="orders")
        assert purge.status == 422, "a purge says `confirm=purge`"
        purged = await api.call(
            "DELETE", "/ops/dead-letters", operator, queue="orders", confirm="purge"
        )
        assert purged.body == {"purged": {names.dlq(names.orders): 2}}, purged
        assert (await api.call("GET", "/ops/dead-letters", viewer)).body["messages"] == []
    finally:
        await connection.close()
