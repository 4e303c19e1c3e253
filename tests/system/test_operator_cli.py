"""The operator's commands, run as real processes against a running system."""

from __future__ import annotations

import json
import subprocess
from collections import Counter
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import aio_pika
import pytest

from services.cli import order_actions as cli_actions
from services.operator import actions
from services.operator.explain import current_step
from services.operator.views import state_query
from shared.broker.consumer import DEAD_LETTERED_AT, DELIVERIES, ERROR, REASON, SOURCE_QUEUE
from shared.broker.rabbitmq.connection import connect
from shared.broker.topology import Names
from shared.domain.journal import HistoryEventType
from shared.domain.messages import SubmitOrder
from shared.domain.models import ErrorInfo, StateRecord
from shared.domain.states import ErrorKind, ProcessState
from shared.domain.timing import utcnow
from shared.domain.updates import Changes, Expect
from tests.conftest import POSTGRES_URL, RABBITMQ_URL, RABBITMQ_USER
from tests.support.factories import order_data
from tests.support.topology import Topology, running_topology
from tests.support.waiting import eventually

pytestmark = [pytest.mark.rabbitmq, pytest.mark.postgres]


@pytest.fixture
async def topo(hub: str, tmp_path: Path) -> AsyncIterator[Topology]:
    async with running_topology(hub, tmp_path) as t:
        yield t


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def as_json(result: subprocess.CompletedProcess[str]) -> Any:
    return json.loads(ok(result))


def one_line_error(result: subprocess.CompletedProcess[str], code: int) -> str:
    assert result.returncode == code, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("orderflow: error: "), result.stderr
    return lines[0]


async def test_find_an_error_order_show_it_and_resubmit_it_once_the_remote_is_back(
    topo: Topology, capsys: pytest.CaptureFixture[str]
) -> None:
    topo.env = topo.env | {"ORDERFLOW_FAILURE_THRESHOLD": "2"}
    await topo.start_all()
    await topo.remote.set_faults(outage=True)
    ids = json.loads(ok(topo.cli("submit", "--json", "--count", "3", "--seed", "51")))["order_ids"]

    async def parked() -> bool:
        return (await topo.counts())[ProcessState.ERROR] == 3

    await eventually(parked, timeout=60, what="3 orders parked in Error")

    listed = as_json(topo.cli("orders", "list", "--state", "Error", "--json"))
    assert sorted(o["order_id"] for o in listed["orders"]) == sorted(ids)
    assert {o["error"]["kind"] for o in listed["orders"]} == {"recovery-limit"}
    assert {o["step"] for o in listed["orders"]} == {"reserve"}
    assert listed["next"] is None
    by_step = as_json(topo.cli("orders", "list", "--step", "charge", "--json"))
    assert by_step["orders"] == []
    page = as_json(topo.cli("orders", "list", "--limit", "2", "--json"))
    assert len(page["orders"]) == 2 and page["next"]
    rest = as_json(topo.cli("orders", "list", "--limit", "2", "--after", page["next"], "--json"))
    assert [o["order_id"] for o in page["orders"] + rest["orders"]] == [
        o["order_id"] for o in listed["orders"]
    ]
    groups = as_json(topo.cli("orders", "list", "--group-by", "error", "--json"))["groups"]
    # Parked after real 503s (the agent said so) or after deadlines (the open circuit failed
    # fast): one group per last cause, every one a recovery limit.
    assert {g["error_kind"] for g in groups} == {"recovery-limit"}
    assert sum(g["count"] for g in groups) == 3
    assert all(g["fingerprint"].startswith("recovered # times") for g in groups)
    assert "recovery-limit" in ok(topo.cli("orders", "list", "--group-by", "error"))

    order_id = ids[0]
    shown = as_json(topo.cli("orders", "show", order_id, "--json"))
    assert shown["state"]["process_state"] == "Error"
    assert shown["state"]["failure_count"] == 2
    assert f"orderflow orders resubmit {order_id}" in shown["state"]["next"]
    assert [s["step"] for s in shown["state"]["steps"]] == ["reserve", "charge", "ship"]
    assert shown["order"]["payment_token"].endswith("…")
    human = ok(topo.cli("orders", "show", order_id))
    assert "next: parked for an operator" in human and "steps" in human

    history = as_json(topo.cli("orders", "history", order_id, "--json"))["events"]
    kinds = [e["event"] for e in history]
    assert kinds[0] == "OrderSubmitted" and "Recovered" in kinds and kinds[-1] == "ErrorRaised"
    assert all(e["since_previous_s"] >= 0 for e in history)
    assert "ErrorRaised" in ok(topo.cli("orders", "history", order_id))

    before = {o["order_id"]: o["updated_at"] for o in listed["orders"]}
    dry = as_json(topo.cli("orders", "resubmit", "--state", "Error", "--dry-run", "--json"))
    assert dry["dry_run"] and len(dry["done"]) == 3 and not dry["refused"]
    assert all(d["outcome"] == "would go Error -> Pending" for d in dry["done"])
    after = as_json(topo.cli("orders", "list", "--state", "Error", "--json"))
    assert {o["order_id"]: o["updated_at"] for o in after["orders"]} == before, "dry run"

    # The selection `resubmit --state Error --error-kind recovery-limit` makes; then two of its
    # orders change (through the store, as another writer would) before the action runs.
    error = frozenset({ProcessState.ERROR})
    query = state_query(error, ErrorKind.RECOVERY_LIMIT, None, now=utcnow())
    selection = await actions.select(topo.store, query, None)
    assert sorted(o for o, _ in selection.orders) == sorted(ids)
    _, old, declined = ids
    await _change(topo, old, updated_at=utcnow() - timedelta(hours=2))
    card = ErrorInfo(kind=ErrorKind.PERMANENT, message="card declined", at=utcnow())
    await _change(topo, declined, error=card, updated_at=utcnow())
    # The listing filters leave out what does not match.
    assert _listed(topo, "--older-than", "1h") == {old}
    assert _listed(topo, "--error-kind", "permanent") == {declined}
    assert _listed(topo, "--state", "Error", "--error-kind", "recovery-limit") == {order_id, old}

    await topo.remote.set_faults(outage=False)
    action = actions.resubmit_action(None, keep_failures=False)
    outcomes = await actions.act(topo.store, selection, action, "alice", dry_run=False, rate=None)
    assert dict(outcomes) == {
        order_id: "Error -> Pending",
        old: "refused: changed since it was selected (now Error); select it again",
        declined: "refused: changed since it was selected (now Error): "
        "error kind permanent, not recovery-limit",
    }
    with pytest.raises(SystemExit) as exited:
        cli_actions.report(outcomes, as_json=False, dry_run=False)
    assert exited.value.code == 1
    assert "1 changed, 2 refused" in capsys.readouterr().out
    for refused_id in (old, declined):
        state = await topo.store.get_state(refused_id)
        assert state is not None and state.process_state is ProcessState.ERROR
        assert await topo.history(refused_id, HistoryEventType.RESUBMITTED) == []

    done = as_json(topo.cli("orders", "resubmit", "--state", "Error", "--by", "oncall", "--json"))
    assert sorted(d["order_id"] for d in done["done"]) == sorted([old, declined])

    async def processed() -> bool:
        return (await topo.counts())[ProcessState.PROCESSED] == 3

    await eventually(processed, timeout=30, what="the resubmitted orders Processed")
    [resubmitted] = await topo.history(order_id, HistoryEventType.RESUBMITTED)
    assert resubmitted.data == {
        "by": "alice",
        "from": "Error",
        "from_step": "reserve",
        "reset_failures": True,
    }
    assert [e.data["by"] for e in await topo.history(old, HistoryEventType.RESUBMITTED)] == [
        "oncall"
    ]

    again = topo.cli("orders", "resubmit", order_id)
    assert again.returncode == 1
    assert "refused: resubmit" in again.stdout or "refused" in again.stdout
    assert "0 changed, 1 refused" in again.stdout
    await _resubmit_from_a_completed_step(topo)
    report = await topo.audit()
    assert report["ok"], report["violations"]


async def _resubmit_from_a_completed_step(topo: Topology) -> None:
    """An order stopped at ship, resubmitted from charge: reserve is not run again, charge and
    ship are, and the remote service made each effect once (charge's repeat got its first
    outcome back, same idempotency key)."""
    await topo.remote.set_faults(fail_operations=["shipping.create"])
    ok(topo.cli("submit", "--order-id", "o-ship"))

    async def parked() -> StateRecord | None:
        state = await topo.store.get_state("o-ship")
        return state if state and state.process_state is ProcessState.ERROR else None

    stopped = await eventually(parked, timeout=60, what="o-ship parked in Error at ship")
    assert stopped is not None and current_step(stopped) == "ship"
    await topo.remote.set_faults(fail_operations=[])
    args = ("o-ship", "--from-step", "charge", "--keep-failures", "--json")
    assert as_json(topo.cli("orders", "resubmit", *args))["done"][0]["order_id"] == "o-ship"

    async def processed() -> StateRecord | None:
        state = await topo.store.get_state("o-ship")
        return state if state and state.process_state is ProcessState.PROCESSED else None

    finished = await eventually(processed, timeout=30, what="o-ship Processed")
    assert finished is not None
    assert finished.steps["reserve"] == stopped.steps["reserve"], "reserve was not run again"
    assert finished.steps["charge"].completed_at != stopped.steps["charge"].completed_at
    completed = Counter(
        e.step for e in await topo.history("o-ship", HistoryEventType.STEP_COMPLETED)
    )
    assert completed == {"reserve": 1, "charge": 2, "ship": 1}
    [event] = await topo.history("o-ship", HistoryEventType.RESUBMITTED)
    assert (event.data["from_step"], event.data["reset_failures"]) == ("charge", False)
    effects = await topo.remote.ledger(order_id="o-ship", account=topo.hub)
    assert Counter(e["operation"] for e in effects if e["outcome"] == "applied") == {
        "inventory.reserve": 1,
        "payment.charge": 1,
        "shipping.create": 1,
    }


async def _change(topo: Topology, order_id: str, **fields: Any) -> None:
    changed = await topo.store.update_state(order_id, Expect(), Changes(fields=fields))
    assert changed is not None


def _listed(topo: Topology, *args: str) -> set[str]:
    found = as_json(topo.cli("orders", "list", *args, "--json"))["orders"]
    return {o["order_id"] for o in found}


async def test_compensate_prints_its_plan_and_a_dry_run_changes_nothing(topo: Topology) -> None:
    topo.env = topo.env | {"ORDERFLOW_FAILURE_THRESHOLD": "2"}
    await topo.start_all(
        ORDERFLOW_REMOTE_DECLINE_RATE="1", ORDERFLOW_REMOTE_FAIL_OPERATIONS="inventory.release"
    )
    [order_id] = as_json(topo.cli("submit", "--json", "--order-id", "o-undo"))["order_ids"]

    async def failed() -> bool:
        return (await topo.counts())[ProcessState.COMPENSATION_FAILED] == 1

    await eventually(failed, timeout=40, what="the compensation to fail")
    before = await topo.store.get_state(order_id)
    dry = as_json(topo.cli("orders", "compensate", order_id, "--dry-run", "--json"))
    [planned] = dry["orders"]
    assert planned["outcome"] == "would go CompensationFailed -> Compensating"
    assert [(s["step"], s["undo"]) for s in planned["plan"]] == [
        ("charge", "payment.refund"),
        ("reserve", "inventory.release"),
    ]
    assert all(s["idempotency_key"] for s in planned["plan"])
    assert await topo.store.get_state(order_id) == before, "a dry run changes nothing"

    await topo.remote.set_faults(fail_operations=[])
    out = ok(topo.cli("orders", "compensate", order_id, "--by", "oncall"))
    assert "undo plan" in out and "inventory.release for reserve" in out
    assert "CompensationFailed -> Compensating" in out

    async def compensated() -> bool:
        return (await topo.counts())[ProcessState.COMPENSATED] == 1

    await eventually(compensated, timeout=30, what="the order Compensated")
    report = await topo.audit()
    assert report["ok"], report["violations"]


async def _dead_letter(channel: aio_pika.abc.AbstractChannel, names: Names, body: bytes) -> None:
    """A message as the consumer dead-letters it after its redelivery limit."""
    headers = {
        REASON: "redelivery-limit",
        ERROR: "last error: store timeout",
        SOURCE_QUEUE: names.orders,
        DEAD_LETTERED_AT: utcnow().isoformat(),
        DELIVERIES: 6,
    }
    message = aio_pika.Message(
        body,
        message_id="order:o-replayed:1",
        type="order.submit",
        headers=headers,
        content_type="application/json",
        delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
    )
    exchange = await channel.get_exchange(names.dead_letters)
    await exchange.publish(message, routing_key=names.orders)


async def test_dead_letters_are_listed_shown_replayed_once_and_purged(topo: Topology) -> None:
    await topo.start_all()
    names = Names(topo.hub)
    connection = await connect(RABBITMQ_URL, timeout=5, name="dlq-test")
    try:
        channel = await connection.channel()
        body = SubmitOrder(order=order_data("o-replayed")).to_json()
        await _dead_letter(channel, names, body)
        poison = aio_pika.Message(
            b"{not json", message_id="p-1", type="order.submit", user_id=RABBITMQ_USER
        )
        await channel.default_exchange.publish(poison, routing_key=names.orders)

        async def both() -> list[dict[str, Any]] | None:
            rows = as_json(topo.cli("dlq", "list", "--json"))["messages"]
            return rows if len(rows) == 2 else None

        rows = await eventually(both, timeout=20, what="two dead letters")
        assert {(r["message_id"], r["reason"]) for r in rows} == {
            ("order:o-replayed:1", "redelivery-limit"),
            ("p-1", "malformed"),
        }
        assert "malformed" in ok(topo.cli("dlq", "list", "--queue", "orders"))
        shown = ok(topo.cli("dlq", "show", "p-1"))
        assert "reason: malformed" in shown and "{not json" in shown
        [poisoned] = as_json(topo.cli("dlq", "show", "p-1", "--json"))["messages"]
        assert (poisoned["reason"], poisoned["body"]) == ("malformed", "{not json")
        assert poisoned["headers"][SOURCE_QUEUE] == names.orders

        replayed = as_json(topo.cli("dlq", "replay", "order:o-replayed:1", "--json"))
        assert replayed["replayed"] == [{"message_id": "order:o-replayed:1", "queue": names.orders}]

        async def processed() -> bool:
            state = await topo.store.get_state("o-replayed")
            return state is not None and state.process_state is ProcessState.PROCESSED

        await eventually(processed, timeout=30, what="the replayed order Processed")
        # The same message dead-lettered and replayed again adds nothing: its order is recorded
        # (the orders queue is deduped by its records, decision:orders-deduped-by-order).
        await _dead_letter(channel, names, body)
        await eventually(lambda: _count_dlq(topo, 2), timeout=10, what="the second copy in the DLQ")
        ok(topo.cli("dlq", "replay", "order:o-replayed:1"))

        async def found() -> bool:
            return "order recorded already" in topo.logs("submission")

        await eventually(found, timeout=20, what="the second replay finding its order recorded")
        submitted = await topo.history("o-replayed", HistoryEventType.ORDER_SUBMITTED)
        assert len(submitted) == 1
        missing = topo.cli("dlq", "replay", "no-such-id")
        assert missing.returncode == 1

        refused = topo.cli("dlq", "purge", input="n\n")
        assert refused.returncode != 0
        assert len(as_json(topo.cli("dlq", "list", "--json"))["messages"]) == 1
        purged = as_json(topo.cli("dlq", "purge", "--queue", "orders", "--yes", "--json"))
        assert purged == {"purged": {names.dlq(names.orders): 1}}
        assert as_json(topo.cli("dlq", "list", "--json"))["messages"] == []
        assert "0 message(s) deleted" in ok(topo.cli("dlq", "purge", "--queue", "orders", "--yes"))
    finally:
        await connection.close()


async def _count_dlq(topo: Topology, n: int) -> bool:
    return len(as_json(topo.cli("dlq", "list", "--json"))["messages"]) == n


async def test_alerts_stats_and_watch(topo: Topology) -> None:
    topo.env = topo.env | {"ORDERFLOW_FAILURE_THRESHOLD": "1"}
    await topo.start_all(ORDERFLOW_REMOTE_OUTAGE="true")
    ok(topo.cli("submit", "--order-id", "o-alert"))

    async def alerted() -> list[dict[str, Any]] | None:
        found = as_json(topo.cli("alerts", "list", "--since", "5m", "--json"))["alerts"]
        return found or None

    [alert] = await eventually(alerted, timeout=30, what="an alert")
    assert alert["kind"] == "order-error" and alert["order_id"] == "o-alert"
    assert "o-alert" in ok(topo.cli("alerts", "list"))

    stats = as_json(topo.cli("stats", "--json"))
    assert stats["by_state"]["Error"] == 1
    assert stats["leader"] == f"{topo.hub}-supervisor-1"
    assert stats["queues"][f"{topo.hub}.orders"] == 0
    assert stats["stuck_pending"] == [] and stats["overdue"] == []
    assert not stats["stuck_pending_capped"] and not stats["overdue_capped"]
    human = ok(topo.cli("stats"))
    assert "supervisor leader" in human and "open circuit breakers" in human
    assert "stuck Pending orders: 0" in human
    watched = ok(topo.cli("watch", "--count", "2", "--interval", "0.2"))
    assert "orders in hub" in watched
    lines = ok(topo.cli("watch", "--json", "--count", "2", "--interval", "0.2")).splitlines()
    snapshots = [json.loads(line) for line in lines]
    assert len(snapshots) == 2 and all(set(s) == set(stats) for s in snapshots)
    assert snapshots[0]["at"] < snapshots[1]["at"]


async def test_bad_input_and_unreachable_servers_give_one_line_and_an_exit_code(
    topo: Topology,
) -> None:
    line = one_line_error(topo.cli("orders", "show", "bad id!"), 1)
    assert "malformed order id" in line
    assert "no order" in one_line_error(topo.cli("orders", "show", "o-none"), 1)
    assert "not a duration" in one_line_error(topo.cli("orders", "list", "--older-than", "x"), 1)
    assert "not a cursor" in one_line_error(topo.cli("orders", "list", "--after", "x"), 1)
    assert "--state" in one_line_error(topo.cli("orders", "resubmit"), 1)
    assert "no input queue" in one_line_error(topo.cli("dlq", "list", "--queue", "nope"), 1)
    unreachable = POSTGRES_URL.replace("127.0.0.1:5432", "127.0.0.1:1")
    for args in (("orders", "list"), ("alerts", "list"), ("stats",)):
        one_line_error(
            topo.cli("--store-url", unreachable, *args, ORDERFLOW_CONNECT_TIMEOUT_S="2"), 3
        )
    one_line_error(
        topo.cli(
            "--rabbitmq-url",
            "amqp://guest:guest@127.0.0.1:1/",
            "dlq",
            "list",
            ORDERFLOW_CONNECT_TIMEOUT_S="2",
        ),
        3,
    )
    # A bad queue name is refused before anything connects, the broker down or not.
    for command in ("list", "purge"):
        refused = topo.cli(
            "--rabbitmq-url",
            "amqp://guest:guest@127.0.0.1:1/",
            "dlq",
            command,
            "--queue",
            "nope",
            ORDERFLOW_CONNECT_TIMEOUT_S="2",
        )
        assert "no input queue" in one_line_error(refused, 1)


async def test_cancel_a_pending_order_at_once_and_a_processing_one_by_compensation(
    topo: Topology,
) -> None:
    await topo.start_all(schedulers=0)  # nothing claims: the first order stays Pending
    [pending] = as_json(topo.cli("submit", "--json", "--order-id", "o-cancel-1"))["order_ids"]

    async def recorded() -> bool:
        return await topo.store.get_state(pending) is not None

    await eventually(recorded, timeout=30, what="the order recorded")
    out = ok(topo.cli("orders", "cancel", pending, "--by", "customer-7"))
    assert f"{pending}: Pending -> Cancelled" in out
    [event] = await topo.history(pending, HistoryEventType.CANCELLED)
    assert event.data == {"by": "customer-7", "from": "Pending", "to": "Cancelled"}

    # A step that hangs inside the remote service: its order is Processing when cancelled.
    await topo.remote.set_faults(hang_rate=1.0, hang_s=8.0)
    topo.serve("scheduler-1", "scheduler")
    [running] = as_json(topo.cli("submit", "--json", "--order-id", "o-cancel-2"))["order_ids"]

    async def step_running() -> bool:
        state = await topo.store.get_state(running)
        return (
            state is not None
            and state.process_state is ProcessState.PROCESSING
            and any(s.attempts for s in state.steps.values())
        )

    await eventually(step_running, timeout=30, what="a step of the order sent")
    out = ok(topo.cli("orders", "cancel", running, "--json"))
    [done] = json.loads(out)["done"]
    assert done == {"order_id": running, "outcome": "Processing -> Compensating"}
    await topo.remote.set_faults(hang_rate=0.0)  # the undos go through

    async def compensated() -> StateRecord | None:
        state = await topo.store.get_state(running)
        return state if state and state.process_state is ProcessState.COMPENSATED else None

    final = await eventually(compensated, timeout=60, what="the cancelled order Compensated")
    assert final.error is not None and final.error.kind is ErrorKind.CANCELLED

    # Finished orders refuse, with the reason, and exit 1; the others are still cancelled.
    refused = topo.cli("orders", "cancel", running, pending)
    assert refused.returncode == 1
    assert "Compensated already" in refused.stdout and "Cancelled already" in refused.stdout
    report = await topo.audit()
    assert report["ok"], report["violations"]
    assert report["by_state"] == {"Cancelled": 1, "Compensated": 1}
