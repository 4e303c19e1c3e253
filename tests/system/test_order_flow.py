"""The order flow end to end through real processes (PostgreSQL store, real RabbitMQ)."""

from __future__ import annotations

import json
import re
import signal
from collections import Counter
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path

import pytest

from harness.remote.app import declined
from shared.broker.port import Outgoing
from shared.broker.publisher import Publisher
from shared.broker.rabbitmq import connect as connect_port
from shared.broker.topology import Names
from shared.domain.coordination import SUPERVISOR_LEASE
from shared.domain.journal import AlertKind, HistoryEventType
from shared.domain.messages import StepAction, StepOutcome, StepReply, SubmitOrder
from shared.domain.models import Address, OrderData, OrderLine
from shared.domain.states import ErrorKind, ProcessState, StepStatus
from shared.domain.timing import utcnow
from shared.domain.updates import Changes, Expect
from tests.conftest import RABBITMQ_URL
from tests.support.factories import order_data, order_pair
from tests.support.topology import Topology, all_orders, running_topology
from tests.support.waiting import eventually

pytestmark = [pytest.mark.rabbitmq, pytest.mark.postgres]


@pytest.fixture
async def topo(hub: str, tmp_path: Path) -> AsyncIterator[Topology]:
    async with running_topology(hub, tmp_path) as t:
        yield t


def submit(topo: Topology, *args: str) -> dict:
    result = topo.cli("submit", "--json", *args)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def effects_per_step(effects: list[dict]) -> Counter:
    return Counter((e["order_id"], e["operation"]) for e in effects if e["outcome"] == "applied")


async def test_fifty_orders_are_processed_with_one_effect_per_step(topo: Topology) -> None:
    await topo.start_all()
    assert submit(topo, "--count", "50", "--seed", "1")["published"] == 50
    counts = await topo.wait_settled(50, timeout=60)
    assert counts[ProcessState.PROCESSED] == 50

    effects = await topo.remote.ledger()
    per_step = effects_per_step(effects)
    assert len(per_step) == 150
    assert set(per_step.values()) == {1}
    for state in await all_orders(topo):
        assert all(s.status is StepStatus.COMPLETED for s in state.steps.values())
        assert state.locked_by is None
    report = await topo.audit()
    assert report["ok"], report["violations"]
    assert report["by_state"] == {"Processed": 50}


async def test_transient_errors_and_declines_end_processed_or_compensated(topo: Topology) -> None:
    rate = 0.05
    await topo.start_all(
        ORDERFLOW_REMOTE_TRANSIENT_ERROR_RATE="0.2", ORDERFLOW_REMOTE_DECLINE_RATE=str(rate)
    )
    assert submit(topo, "--count", "200", "--seed", "2")["published"] == 200
    counts = await topo.wait_settled(200, timeout=150)
    assert counts[ProcessState.PROCESSED] + counts[ProcessState.COMPENSATED] == 200

    states = await all_orders(topo)
    expected_declines = {s.order_id for s in states if declined(s.order_id, rate)}
    compensated = {s.order_id for s in states if s.process_state is ProcessState.COMPENSATED}
    assert compensated == expected_declines
    assert expected_declines, "the seed should decline some orders"
    for state in states:
        if state.process_state is ProcessState.COMPENSATED:
            # A declined payment compensates the inventory reservation (the default setting).
            assert state.error is not None and state.error.kind is ErrorKind.PERMANENT
            assert state.steps["reserve"].status is StepStatus.COMPENSATED
            # The failed step's undo runs too (a failure cannot prove there was no effect);
            # the refund finds no charge and changes nothing, and the step keeps its error.
            charge = state.steps["charge"]
            assert charge.status is StepStatus.COMPENSATED
            assert charge.error is not None and "declined" in charge.error.message
            assert state.steps["ship"].status is StepStatus.NOT_STARTED
            assert state.locked_by is None
    per_step = effects_per_step(await topo.remote.ledger())
    assert set(per_step.values()) == {1}, "no step has two effects"
    released = {order_id for order_id, op in per_step if op == "inventory.release"}
    assert released == expected_declines, "each declined order's reservation is released once"
    assert not {order_id for order_id, op in per_step if op == "payment.refund"}
    report = await topo.audit()
    assert report["ok"], report["violations"]
    alerts = await topo.store.list_alerts(limit=1000)
    assert not {a.order_id for a in alerts if a.kind is AlertKind.ORDER_ERROR}


async def test_a_hung_call_is_abandoned_recovered_and_completed_once(topo: Topology) -> None:
    await topo.start_all(ORDERFLOW_REMOTE_HANG_RATE="1", ORDERFLOW_REMOTE_HANG_S="4")
    order_id = submit(topo, "--order-id", "o-hang")["order_ids"][0]

    async def deadline_expired() -> bool:
        return bool(await topo.history(order_id, HistoryEventType.DEADLINE_EXPIRED))

    await eventually(deadline_expired, timeout=20, what="the first attempt to give up waiting")
    first = await topo.store.get_state(order_id)
    await topo.remote.set_faults(hang_rate=0)

    counts = await topo.wait_settled(1, timeout=30)
    assert counts[ProcessState.PROCESSED] == 1
    state = await topo.store.get_state(order_id)
    assert state.attempt >= 2
    assert state.failure_count >= 1
    # The scheduler stopped waiting and the supervisor recovered the attempt: not the
    # scheduler's own give-back after transient failures, which writes Recovered too.
    history = await topo.history(order_id)
    kinds = [e.type for e in history]
    expired = kinds.index(HistoryEventType.DEADLINE_EXPIRED)
    recovered = [e for e in history if e.type is HistoryEventType.RECOVERED]
    assert recovered, kinds
    assert expired < kinds.index(HistoryEventType.RECOVERED), kinds
    assert {e.data["by"] for e in recovered} == {f"{topo.hub}-supervisor-1"}, recovered
    assert recovered[0].attempt == history[expired].attempt == 1

    # A late reply to the first attempt reaches the scheduler: it is ignored.
    await _send_late_reply(topo, order_id)

    async def ignored() -> bool:
        return "late or unknown reply ignored" in topo.logs("scheduler-1")

    await eventually(ignored, what="the scheduler to ignore the late reply")
    # The first attempt's hung call, replayed at the remote service, makes no second effect.
    late = await _late_reply_to_first_attempt(topo, first)
    assert late["outcome"] == "applied" and late["replayed"] is True
    effects = await topo.remote.ledger(order_id=order_id)
    assert Counter(e["operation"] for e in effects) == Counter(
        {"inventory.reserve": 1, "payment.charge": 1, "shipping.create": 1}
    )
    assert await topo.store.get_state(order_id) == state
    report = await topo.audit()
    assert report["ok"], report["violations"]


async def _send_late_reply(topo: Topology, order_id: str) -> None:
    ready = next(
        json.loads(line)
        for line in topo.logs("scheduler-1").splitlines()
        if '"scheduler ready"' in line
    )
    connection = await connect_port(RABBITMQ_URL, timeout=5, name="late-reply")
    publisher = await Publisher.open(connection, timeout=5)
    reply = StepReply(
        order_id=order_id,
        step="reserve",
        action=StepAction.DO,
        fencing_token=f"{order_id}:1",
        idempotency_key=f"{order_id}:reserve",
        outcome=StepOutcome.OK,
        attempts_used=1,
        result={"forged": True},
    )
    await publisher.publish(
        reply,
        exchange="",
        routing_key=ready["reply_queue"],
        message_id="late-1",
        correlation_id=f"{order_id}:1:reserve:1",
    )
    await connection.close()


async def _late_reply_to_first_attempt(topo: Topology, first) -> dict:
    """Replay the first attempt's request at the remote service, as its hung call does when it
    wakes: the ledger answers with the first outcome and makes no second effect."""
    return await topo.remote.call(
        "inventory.reserve",
        order_id=first.order_id,
        idempotency_key=f"{first.order_id}:reserve",
        fencing_token=f"{first.order_id}:1",
        fencing_signature=topo.sign(f"{first.order_id}:1"),
        payload={},
        timeout=10,
    )


async def test_only_the_leader_recovers_and_another_takes_over_when_it_dies(topo: Topology) -> None:
    topo.serve("supervisor-1", "supervisor")
    topo.serve("supervisor-2", "supervisor")

    async def leader() -> str | None:
        lease = await topo.store.lease_get("supervisor")
        return lease.holder if lease and lease.expires_at > utcnow() else None

    first_leader = await eventually(leader, timeout=15, what="a leader")
    orphans = await _orphan_attempts(topo, "a", 5)

    async def recovered(ids: list[str]) -> bool:
        states = [await topo.store.get_state(i) for i in ids]
        return all(s.process_state is ProcessState.PENDING for s in states)

    await eventually(lambda: recovered(orphans), timeout=15, what="the orphans recovered")
    by = {e.data["by"] for o in orphans for e in await topo.history(o, HistoryEventType.RECOVERED)}
    assert by == {first_leader}

    label = first_leader.removeprefix(f"{topo.hub}-")
    topo.kill(label)
    killed_at = utcnow()
    more = await _orphan_attempts(topo, "b", 5)

    async def new_leader() -> str | None:
        holder = await leader()
        return holder if holder not in (None, first_leader) else None

    second_leader = await eventually(new_leader, timeout=15, what="another leader")
    lease = await topo.store.lease_get(SUPERVISOR_LEASE)
    assert lease is not None and lease.holder == second_leader
    # The dead leader renewed at most at its death; its lease (2 s) then ran out, and the
    # standby, waiting for exactly that, took it: within a lease period, plus scheduling.
    took_over = (lease.acquired_at - killed_at).total_seconds()
    assert took_over < 2 + 0.5, f"replaced {took_over:.2f}s after the kill"
    await eventually(lambda: recovered(more), timeout=15, what="the new orphans recovered")
    by = {e.data["by"] for o in more for e in await topo.history(o, HistoryEventType.RECOVERED)}
    assert by == {second_leader}


async def _orphan_attempts(topo: Topology, tag: str, n: int) -> list[str]:
    """Orders a scheduler claimed and then died on: Processing, locked, deadline passed."""
    ids = []
    for i in range(n):
        order, state = order_pair(f"orphan-{tag}-{i}")
        await topo.store.insert_order(order, state)
        await topo.store.update_state(
            order.order_id,
            Expect(),
            Changes(
                fields={
                    "process_state": ProcessState.PROCESSING,
                    "attempt": 1,
                    "locked_by": f"{order.order_id}:1",
                    "complete_by": utcnow() - timedelta(seconds=1),
                }
            ),
        )
        ids.append(order.order_id)
    return ids


async def test_a_conflicting_resubmission_is_dead_lettered_and_overwrites_nothing(
    topo: Topology,
) -> None:
    topo.serve("submission", "submission")
    first = tmp_order(topo.workdir / "first.json", customer_id="alice")
    second = tmp_order(topo.workdir / "second.json", customer_id="mallory")
    assert topo.cli("submit", "--file", str(first)).returncode == 0

    async def recorded() -> bool:
        return await topo.store.get_order("o-dup") is not None

    await eventually(recorded, what="the first order recorded")
    assert topo.cli("submit", "--file", str(second)).returncode == 0

    async def alerted() -> list:
        return [
            a for a in await topo.store.list_alerts() if a.kind is AlertKind.DUAL_WRITE_CONFLICT
        ]

    await eventually(alerted, what="a conflict alert")
    assert (await topo.store.get_order("o-dup")).data.customer_id == "alice"
    stats = json.loads(topo.cli("stats", "--json").stdout)
    assert stats["queues"][f"{topo.hub}.orders.dlq"] == 1


def tmp_order(path: Path, **overrides) -> Path:
    path.write_text(order_data("o-dup", **overrides).model_dump_json())
    return path


async def test_submission_stops_taking_orders_over_the_backlog_threshold(topo: Topology) -> None:
    topo.env["ORDERFLOW_BACKLOG_THRESHOLD"] = "5"
    topo.env["ORDERFLOW_BACKLOG_CHECK_S"] = "0.1"
    topo.serve("submission", "submission", ORDERFLOW_PREFETCH="1")
    assert submit(topo, "--count", "30")["published"] == 30

    async def paused() -> bool:
        return any(
            a.kind is AlertKind.BACKLOG_OVER_THRESHOLD for a in await topo.store.list_alerts()
        )

    await eventually(paused, what="submission to pause")
    backlog = (await topo.counts())[ProcessState.PENDING]
    assert 5 < backlog <= 5 + 2, "paused within one prefetch window past the threshold"
    # Once schedulers and agents drain the backlog, submission resumes and takes the rest.
    await topo.start_all()
    counts = await topo.wait_settled(30, timeout=60)
    assert counts[ProcessState.PROCESSED] == 30


async def test_submit_wait_follows_status_messages(topo: Topology) -> None:
    await topo.start_all()
    result = topo.cli("submit", "--count", "3", "--wait", "--timeout", "60")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    for status in ("Received", "Processing", "Completed"):
        assert sum(line.endswith(f": {status}") for line in lines) == 3, result.stdout
    assert "Completed: 3" in result.stdout


async def test_submit_publishes_one_order_stated_by_flags(topo: Topology) -> None:
    await topo.start_all()
    result = topo.cli(
        "submit",
        "--order-id", "o-flags",
        "--customer-id", "cust-flags",
        "--line", "sku-a:2:1250",
        "--line", "sku-b:1:499",
        "--currency", "USD",
        "--payment-token", "tok_flags_4242",
        "--ship-name", "Grace Hopper",
        "--ship-line1", "1 Navy Way",
        "--ship-city", "Arlington",
        "--ship-postal-code", "22202",
        "--ship-country", "US",
        "--wait", "--timeout", "60",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "o-flags: Completed" in result.stdout.splitlines(), result.stdout
    stored = await topo.store.get_order("o-flags")
    assert stored is not None
    assert stored.data == OrderData(
        order_id="o-flags",
        customer_id="cust-flags",
        lines=[
            OrderLine(sku="sku-a", quantity=2, unit_price_cents=1250),
            OrderLine(sku="sku-b", quantity=1, unit_price_cents=499),
        ],
        currency="USD",
        payment_token="tok_flags_4242",
        shipping_address=Address(
            name="Grace Hopper",
            line1="1 Navy Way",
            city="Arlington",
            postal_code="22202",
            country="US",
        ),
    )
    assert (await topo.store.get_state("o-flags")).process_state is ProcessState.PROCESSED


async def test_submit_wait_shows_a_declined_order_compensated(topo: Topology) -> None:
    await topo.start_all(ORDERFLOW_REMOTE_DECLINE_RATE="1")
    result = topo.cli("submit", "--count", "2", "--wait", "--timeout", "60")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    for status in ("Received", "Processing", "Compensated"):
        # A status may carry a detail in parentheses (Compensated: the failure that caused it).
        shown = re.compile(rf": {status}(?: \(.+\))?$")
        assert sum(bool(shown.search(line)) for line in lines) == 2, result.stdout
    assert sum("Compensated (payment" in line for line in lines) == 2, result.stdout


async def test_processes_drain_and_exit_cleanly_on_sigterm(topo: Topology) -> None:
    await topo.start_all()
    submit(topo, "--count", "20")
    await topo.wait_settled(20, timeout=60)
    for label in list(topo.procs):
        topo.signal(label, signal.SIGTERM)
    for label, proc in topo.procs.items():
        assert proc.wait(timeout=20) == 0, label


async def test_a_later_attempt_resumes_after_the_last_completed_step(topo: Topology) -> None:
    # A scheduler completed `reserve` and died during `charge`.
    order, state = order_pair("o-resume")
    await topo.store.insert_order(order, state)
    reserve = state.steps["reserve"].model_copy(
        update={
            "status": StepStatus.COMPLETED,
            "attempts": 1,
            "completed_at": utcnow(),
            "result": {"ref": "made-by-attempt-1"},
        }
    )
    await topo.store.update_state(
        "o-resume",
        Expect(),
        Changes(
            fields={
                "process_state": ProcessState.PROCESSING,
                "attempt": 1,
                "locked_by": "o-resume:1",
                "complete_by": utcnow() - timedelta(seconds=1),
            },
            steps={"reserve": reserve},
        ),
    )
    await topo.start_all()
    counts = await topo.wait_settled(1, timeout=30)
    assert counts[ProcessState.PROCESSED] == 1
    scheduled = [e.step for e in await topo.history("o-resume", HistoryEventType.STEP_SCHEDULED)]
    assert scheduled == ["charge", "ship"]
    final = await topo.store.get_state("o-resume")
    assert final.steps["reserve"].result == {"ref": "made-by-attempt-1"}
    operations = [e["operation"] for e in await topo.remote.ledger(order_id="o-resume")]
    assert operations == ["payment.charge", "shipping.create"]


async def test_the_supervisor_reports_orders_stuck_in_pending(topo: Topology) -> None:
    order, state = order_pair("o-stuck", due_in=timedelta(seconds=-5))
    await topo.store.insert_order(order, state)
    topo.serve("supervisor-1", "supervisor", ORDERFLOW_STUCK_PENDING_S="1")

    async def stuck_alert() -> list:
        return [a for a in await topo.store.list_alerts() if a.kind is AlertKind.STUCK_PENDING]

    alerts = await eventually(stuck_alert, timeout=15, what="a stuck-pending alert")
    assert alerts[0].order_id == "o-stuck"


async def test_submit_reports_a_full_orders_queue_with_a_non_zero_exit(
    hub: str, tmp_path: Path
) -> None:
    async with running_topology(hub, tmp_path, ORDERFLOW_ORDERS_QUEUE_MAX_LENGTH="3") as topo:
        result = topo.cli("submit", "--count", "10", "--concurrency", "1")
        assert result.returncode == 1
        assert "refused by the broker" in result.stderr
        assert result.stdout.startswith("published 3 order(s)") or result.stdout.startswith(
            "published 4 order(s)"
        )


async def test_audit_finds_lost_orders_and_duplicate_effects(topo: Topology) -> None:
    await topo.start_all()
    submit(topo, "--count", "3")
    await topo.wait_settled(3, timeout=30)
    victim = (await all_orders(topo))[0].order_id
    # A second charge under another key, and an attempt no supervisor will ever find.
    await topo.remote.call(
        "payment.charge",
        order_id=victim,
        idempotency_key="rogue-key",
        fencing_token=f"{victim}:9",
        fencing_signature=topo.sign(f"{victim}:9"),
        payload={},
        timeout=5,
    )
    lost, lost_state = order_pair("o-lost")
    # Written Processing from the start: a Pending record would be claimed by the running
    # scheduler before the test could change it.
    await topo.store.insert_order(
        lost,
        lost_state.model_copy(
            update={
                "process_state": ProcessState.PROCESSING,
                "locked_by": "o-lost:1",
                "attempt": 1,
                "complete_by": None,
            }
        ),
    )

    result = topo.cli("audit")
    assert result.returncode == 1
    assert f"violation of invariant 2: {victim}: 2 effects of payment.charge" in result.stdout
    assert "violation of invariant 1: o-lost: Processing with no deadline" in result.stdout


async def test_a_reply_to_that_is_not_a_status_queue_of_the_app_gets_no_statuses(
    topo: Topology,
) -> None:
    await topo.start_all()
    names = Names(topo.hub)
    connection = await connect_port(RABBITMQ_URL, timeout=5, name="spoofer")
    try:
        publisher = await Publisher.open(connection, timeout=5)
        # A scheduler's reply queue, and another application's status queue (the publisher
        # says it is `guest`, which RabbitMQ checks): neither may receive this order's statuses.
        for order_id, reply_to in (
            ("o-spoof-1", f"{topo.hub}.reply.scheduler-x.abc"),
            ("o-spoof-2", names.status_queue("other-app")),
        ):
            await publisher.publish_raw(
                Outgoing(
                    SubmitOrder(order=order_data(order_id), reply_to=reply_to).to_json(),
                    message_id=f"m-{order_id}",
                    type="order.submit",
                    user_id="guest",
                ),
                exchange=names.submit,
                routing_key=names.orders,
            )
    finally:
        await connection.close()
    counts = await topo.wait_settled(2, timeout=60)
    assert counts[ProcessState.PROCESSED] == 2, "the orders themselves are fine"
    for order_id in ("o-spoof-1", "o-spoof-2"):
        state = await topo.store.get_state(order_id)
        assert state is not None and state.reply_to is None
    assert topo.logs("submission").count("reply_to refused") == 2
    assert all(p.poll() is None for p in topo.procs.values())
