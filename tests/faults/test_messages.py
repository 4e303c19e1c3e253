"""Messages that repeat, arrive late, or should never have been sent."""

from __future__ import annotations

import asyncio
import json
from collections import Counter

import aio_pika
import pytest

from shared.broker.consumer import REASON, SOURCE_QUEUE
from shared.broker.rabbitmq.connection import connect
from shared.broker.topology import Names
from shared.domain.journal import AlertKind, HistoryEventType
from shared.domain.messages import StepAction, StepOutcome, StepReply, SubmitOrder
from shared.domain.states import ErrorKind, ProcessState
from shared.domain.timing import utcnow
from tests.conftest import RABBITMQ_URL, RABBITMQ_USER
from tests.faults.conftest import FaultRun, alerts_for, everywhere
from tests.support.factories import order_data
from tests.support.topology import Topology
from tests.support.waiting import eventually

pytestmark = [pytest.mark.rabbitmq, pytest.mark.postgres, pytest.mark.faults]


@pytest.mark.parametrize("declines", ["park", "compensate"])
async def test_duplicate_delivery_of_every_message_type(topo: Topology, declines: str) -> None:
    compensate = declines == "compensate"
    run = FaultRun(
        topo,
        "every message published twice (orders, requests, replies, statuses, alerts"
        + (", undo requests and replies)" if compensate else ")"),
    )
    # Every publisher of every process (and `submit`) sends each message twice with the same
    # message_id. Declines park some orders in Error (so alerts are duplicated too), or are
    # compensated (so undo requests and their replies are).
    everywhere(
        topo,
        ORDERFLOW_FAULT_DUPLICATE_RATE="1",
        ORDERFLOW_FAULT_SEED="21",
        ORDERFLOW_COMPENSATE_ON="permanent" if compensate else "budget-exhausted",
    )
    await topo.start_all(ORDERFLOW_REMOTE_DECLINE_RATE="0.1")
    run.struck()
    submitted = await asyncio.to_thread(
        topo.cli, "submit", "--json", "--wait", "--count", "100", "--seed", "21", timeout=150
    )
    result = json.loads(submitted.stdout)
    run.order_ids += result["order_ids"]

    states = await run.settle(timeout=60)
    by_state = Counter(s.process_state for s in states)
    failed = ProcessState.COMPENSATED if compensate else ProcessState.ERROR
    assert by_state[ProcessState.PROCESSED] + by_state[failed] == 100
    assert by_state[failed] > 0
    # One final status per order reached the submitter, though each was sent twice.
    assert result["final"] == {
        "Completed": by_state[ProcessState.PROCESSED],
        "Compensated" if compensate else "Failed": by_state[failed],
    }
    for label in ("inventory", "payment", "shipping"):
        assert "duplicate message dropped" in topo.logs(label), label
    # Submission claims no inbox entry: the order's insert is its dedupe
    # (decision:orders-deduped-by-order).
    assert "order recorded already" in topo.logs("submission")
    assert "duplicate message dropped" not in topo.logs("submission")
    # The second copy of every reply finds its request answered already.
    assert "late or unknown reply ignored" in topo.logs("scheduler-1")
    for order_id in run.order_ids:
        assert len(await topo.history(order_id, HistoryEventType.ORDER_SUBMITTED)) == 1
    if compensate:
        # Each compensated order's reservation released once, though its undo was sent twice.
        effects = await topo.remote.ledger()
        released = Counter(e["order_id"] for e in effects if e["operation"] == "inventory.release")
        assert released == Counter(
            s.order_id for s in states if s.process_state is ProcessState.COMPENSATED
        )
        return
    in_error = [s.order_id for s in states if s.process_state is ProcessState.ERROR]
    await alerts_for(topo, AlertKind.ORDER_ERROR, in_error)
    alerts = await topo.store.list_alerts(limit=1000)
    errors = [a.order_id for a in alerts if a.kind is AlertKind.ORDER_ERROR]
    assert sorted(errors) == sorted(in_error), "one stored alert per order in Error"


async def test_a_reply_arriving_after_its_deadline_is_ignored(topo: Topology) -> None:
    run = FaultRun(topo, "20% of agent replies held back past the step deadline")
    everywhere(
        topo,
        ORDERFLOW_FAULT_REPLY_DELAY_RATE="0.2",
        ORDERFLOW_FAULT_REPLY_DELAY_MS="2500",
        ORDERFLOW_FAULT_SEED="22",
    )
    await topo.start_all()
    run.struck()
    run.submit(100, seed=22)

    states = await run.settle(timeout=120)
    # A request whose reply comes late counts its whole allowance as spent, so an order unlucky
    # enough to see four late replies has spent its retry budget: Error, with an alert naming it.
    processed = [s for s in states if s.process_state is ProcessState.PROCESSED]
    parked = [s for s in states if s.process_state is not ProcessState.PROCESSED]
    assert len(processed) >= 90
    for state in parked:
        assert state.process_state is ProcessState.ERROR
        assert state.error is not None and state.error.kind is ErrorKind.BUDGET_EXHAUSTED
    alerts = await alerts_for(topo, AlertKind.ORDER_ERROR, [s.order_id for s in parked])
    assert all("retry budget" in alerts[s.order_id].message for s in parked)
    assert any(s.attempt >= 2 for s in states), "late replies made attempts expire"

    async def ignored() -> bool:
        return "late or unknown reply ignored" in topo.logs("scheduler-1")

    await eventually(ignored, timeout=10, what="a late reply to reach the scheduler")


def _poison(names: Names) -> list[tuple[str, str, bytes, str, str]]:
    """(queue, message_id, body, AMQP type, the reason it must be dead-lettered for)."""
    order = json.loads(SubmitOrder(order=order_data("o-poison")).to_json())
    reply = StepReply(
        order_id="o-poison",
        step="charge",
        action=StepAction.DO,
        fencing_token="o-poison:1",
        idempotency_key="o-poison:charge",
        outcome=StepOutcome.OK,
        attempts_used=1,
    ).to_json()
    request = {
        "schema_version": 1,
        "order_id": "o-poison",
        "step": "charge",
        "action": "do",
        "operation": "payment.charge",
        "fencing_token": "o-poison:1",
        "idempotency_key": "o-poison:charge",
        "complete_by": utcnow().isoformat(),
        "attempts_allowed": 1,
        "reply_to": "nowhere",
    }
    orders, payment = names.orders, names.agent("payment")
    return [
        (orders, "p-malformed", b"{not json", "order.submit", "malformed"),
        (
            orders,
            "p-invalid",
            json.dumps({"schema_version": 1}).encode(),
            "order.submit",
            "invalid",
        ),
        (orders, "p-unknown", json.dumps(order).encode(), "order.cancel", "unknown-type"),
        (
            orders,
            "p-version",
            json.dumps(order | {"schema_version": 99}).encode(),
            "order.submit",
            "unsupported-schema-version",
        ),
        (orders, "p-large", b"{" + b" " * 70_000 + b"}", "order.submit", "too-large"),
        (orders, "p-wrong", reply, "step.reply", "wrong-type"),
        (payment, "p-malformed", b"\xff\xfe", "step.request", "malformed"),
        (
            payment,
            "p-invalid",
            json.dumps(request | {"attempts_allowed": 0}).encode(),
            "step.request",
            "invalid",
        ),
        (
            payment,
            "p-version",
            json.dumps(request | {"schema_version": 2}).encode(),
            "step.request",
            "unsupported-schema-version",
        ),
    ]


async def test_poison_input_is_dead_lettered_and_every_process_keeps_running(
    topo: Topology,
) -> None:
    run = FaultRun(topo, "poison messages on the orders and agent queues")
    await topo.start_all()
    names = Names(topo.hub)
    poison = _poison(names)
    connection = await connect(RABBITMQ_URL, timeout=5, name="poison")
    try:
        channel = await connection.channel()
        for queue, message_id, body, type_, _ in poison:
            message = aio_pika.Message(
                body,
                message_id=message_id,
                type=type_,
                content_type="application/json",
                user_id=RABBITMQ_USER,  # a broken process, not a stranger: decoding refuses it
            )
            await channel.default_exchange.publish(message, routing_key=queue)
        run.struck()
        run.submit(20, seed=23)
        states = await run.settle(timeout=60)
        assert all(s.process_state is ProcessState.PROCESSED for s in states)
        assert all(p.poll() is None for p in topo.procs.values()), "every process is up"

        expected = Counter(
            (queue, message_id, reason) for queue, message_id, _, _, reason in poison
        )

        async def dead_lettered() -> Counter[tuple[str, str, str]]:
            found: Counter[tuple[str, str, str]] = Counter()
            for queue in {q for q, *_ in poison}:
                dlq = await channel.declare_queue(names.dlq(queue), passive=True)
                count = dlq.declaration_result.message_count or 0
                if count < sum(1 for q, *_ in poison if q == queue):
                    return Counter()
            for queue in {q for q, *_ in poison}:
                dlq = await channel.get_queue(names.dlq(queue))
                while (got := await dlq.get(no_ack=True, fail=False)) is not None:
                    assert got.headers[SOURCE_QUEUE] == queue
                    found[(queue, str(got.message_id), str(got.headers[REASON]))] += 1
            return found

        found = await eventually(dead_lettered, timeout=20, what="every poison message in a DLQ")
        assert found == expected
    finally:
        await connection.close()

    async def poisoned() -> set[str]:  # each alert follows its message's dead-lettering
        alerts = await topo.store.list_alerts(limit=1000)
        return {a.alert_id for a in alerts if a.kind is AlertKind.POISON_MESSAGE}

    async def all_poisoned() -> bool:
        return len(await poisoned()) >= len(poison)

    await eventually(all_poisoned, timeout=15, what="an alert per poison message")
    assert len(await poisoned()) == len(poison), "one alert per poison message"
