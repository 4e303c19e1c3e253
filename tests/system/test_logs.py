"""Structured logs from real processes: every line is one JSON event naming its hub and process,
and the lines about an order name the order (and, where they apply, the instance and the step).

One topology runs once for the module: a few orders, half of them declined (so that agents log
refusals at INFO), a duplicate delivery, a malformed message and a conflicting resubmission. The
tests read the log files the processes wrote (`Topology.start` sends each process's stdout and
stderr to `<workdir>/<label>.log`) after the processes have stopped.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from harness.remote.app import declined
from shared.broker.consumer import Consumer, ConsumerPolicy, Delivery
from shared.broker.port import Outgoing
from shared.broker.publisher import Publisher
from shared.broker.rabbitmq import connect
from shared.broker.topology import Names, QueuePolicy, declare_topology, delete_topology
from shared.domain.messages import StepAction, StepOutcome, StepReply, SubmitOrder
from shared.domain.states import ProcessState
from shared.store.postgres import PostgresStore
from shared.telemetry import JsonFormatter
from tests.conftest import POSTGRES_URL, RABBITMQ_URL, RABBITMQ_USER, service_missing
from tests.support.factories import order_data
from tests.support.topology import Topology, running_topology
from tests.support.waiting import eventually

pytestmark = [pytest.mark.rabbitmq, pytest.mark.postgres]

DECLINE_RATE = 0.5
ORDER_IDS = tuple(f"o-log-{i:02d}" for i in range(6))
DECLINED = frozenset(o for o in ORDER_IDS if declined(o, DECLINE_RATE))
AGENTS = ("inventory", "payment", "shipping")
DEBUG_AGENT = "payment"
"""Runs at DEBUG, so that its successes are logged too."""
GARBAGE_ID = "m-garbage"
CONFLICT_ID = "m-conflict"
RECORDED_ALREADY = "order recorded already: a copy of its message, or a resubmission"

Line = dict[str, Any]


def kind_of(label: str) -> str:
    """`scheduler-1` -> `scheduler`; the three agents are of kind `agent`."""
    return "agent" if label in AGENTS else label.split("-", maxsplit=1)[0]


@dataclass
class Run:
    hub: str
    lines: dict[str, list[Line]] = field(default_factory=dict)
    """Each process's lines, by label, parsed."""
    unparsable: list[str] = field(default_factory=list)
    states: dict[str, ProcessState] = field(default_factory=dict)

    def of_kind(self, kind: str) -> list[Line]:
        return [line for label, ls in self.lines.items() if kind_of(label) == kind for line in ls]

    def order_lines(self, kind: str) -> list[Line]:
        """The lines of every process of `kind` that are about one of the orders: they carry an
        `order_id`, or mention one anywhere (a line that names an order only in its text is
        about it too, and is what the field checks must catch)."""
        return [line for line in self.of_kind(kind) if about_an_order(line)]


def about_an_order(line: Line) -> bool:
    if line.get("order_id") is not None:
        return True
    text = json.dumps(line)
    return any(order_id in text for order_id in ORDER_IDS)


def missing(lines: list[Line], *fields: str) -> list[Line]:
    return [line for line in lines if any(line.get(f) in (None, "") for f in fields)]


async def _publish(topo: Topology, publisher: Publisher, body: bytes, message_id: str) -> None:
    names = Names(topo.hub)
    await publisher.publish_raw(
        Outgoing(body, message_id=message_id, type="order.submit"),
        exchange=names.submit,
        routing_key=names.orders,
    )


async def _submit_and_wait(topo: Topology) -> None:
    # Started first, so that `start_all` leaves it as it is.
    topo.serve(DEBUG_AGENT, "agent", DEBUG_AGENT, ORDERFLOW_LOG_LEVEL="DEBUG")
    await topo.start_all(ORDERFLOW_REMOTE_DECLINE_RATE=str(DECLINE_RATE))
    connection = await connect(RABBITMQ_URL, timeout=5, name="log-tests")
    try:
        publisher = await Publisher.open(connection, timeout=5)
        for order_id in ORDER_IDS:
            body = SubmitOrder(order=order_data(order_id)).to_json()
            await _publish(topo, publisher, body, f"m-{order_id}")
        # The first order again under the same message id: a copy its record dedupes.
        await _publish(
            topo,
            publisher,
            SubmitOrder(order=order_data(ORDER_IDS[0])).to_json(),
            f"m-{ORDER_IDS[0]}",
        )
        await _publish(topo, publisher, b"not json", GARBAGE_ID)

        async def recorded() -> bool:
            return await topo.store.get_order(ORDER_IDS[1]) is not None

        await eventually(recorded, what="the order to conflict with recorded")
        conflicting = order_data(ORDER_IDS[1], customer_id="mallory")
        await _publish(topo, publisher, SubmitOrder(order=conflicting).to_json(), CONFLICT_ID)
    finally:
        await connection.close()
    await topo.wait_settled(len(ORDER_IDS), timeout=60)

    def submission_wrote(message_id: str, *events: str) -> Any:
        def written() -> bool:
            lines, _ = parse(topo.logs("submission"))
            return set(events) <= {e["event"] for e in lines if e.get("message_id") == message_id}

        return lambda: asyncio.sleep(0, written())

    dropped = submission_wrote(f"m-{ORDER_IDS[0]}", RECORDED_ALREADY)
    await eventually(dropped, what="the copy found recorded")
    for message_id in (CONFLICT_ID, GARBAGE_ID):
        refused = submission_wrote(message_id, "message dead-lettered", "alert raised")
        await eventually(refused, what=f"{message_id} dead-lettered and alerted")


async def _run(workdir: Path) -> Run:
    run = Run(hub=f"t{uuid.uuid4().hex[:12]}")
    async with running_topology(run.hub, workdir) as topo:
        await _submit_and_wait(topo)
        for order_id in ORDER_IDS:
            state = await topo.store.get_state(order_id)
            assert state is not None
            run.states[order_id] = state.process_state
        labels = list(topo.procs)
    # The processes have stopped (and written their last lines).
    for label in labels:
        run.lines[label], bad = parse(topo.logs(label))
        run.unparsable += [f"{label}.log: {line[:300]!r}" for line in bad]
    return run


def parse(text: str) -> tuple[list[Line], list[str]]:
    """The lines of a log that are JSON objects, and the ones that are not."""
    good: list[Line] = []
    bad: list[str] = []
    for line in text.splitlines():
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            event = None
        if isinstance(event, dict):
            good.append(event)
        else:
            bad.append(line)
    return good, bad


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    """The module's one run, in an event loop of its own: the tests only read what it left."""
    return asyncio.run(_run(tmp_path_factory.mktemp("logs")))


def test_the_orders_ended_as_the_decline_rate_says(run: Run) -> None:
    assert DECLINED and set(ORDER_IDS) != DECLINED, "the ids should give both outcomes"
    for order_id, state in run.states.items():
        expected = ProcessState.COMPENSATED if order_id in DECLINED else ProcessState.PROCESSED
        assert state is expected, order_id


def test_every_line_of_every_process_is_an_event_naming_its_hub_and_process(run: Run) -> None:
    assert not run.unparsable, "every line is one JSON object"
    assert set(run.lines) >= {"remote", "submission", "scheduler-1", "supervisor-1", *AGENTS}
    for label, lines in run.lines.items():
        assert lines, f"{label} wrote no lines"
        for line in lines:
            assert line["hub"] == run.hub, line
            assert line["process"] == f"{run.hub}-{label}", line
            assert {"at", "level", "logger", "event"} <= line.keys(), line


def test_agent_lines_about_an_order_name_the_order_instance_step_and_message(run: Run) -> None:
    lines = run.order_lines("agent")
    assert not missing(lines, "order_id", "instance_id", "step", "operation", "message_id")
    refused = [line for line in lines if "declined" in line["event"]]
    assert {line["order_id"] for line in refused} == DECLINED
    for line in refused:
        assert (line["level"], line["step"], line["operation"]) == (
            "info",
            "charge",
            "payment.charge",
        )
        assert line["message_type"] == "step.request"
        assert line["queue"] == f"{run.hub}.agent.payment"


def test_agents_log_a_success_at_debug_only(run: Run) -> None:
    done = [line for line in run.order_lines("agent") if line["event"] == "step done"]
    assert {line["level"] for line in done} == {"debug"}
    # Only the DEBUG agent wrote them: at INFO, a success writes nothing.
    assert {line["process"] for line in done} == {f"{run.hub}-{DEBUG_AGENT}"}
    charged = {line["order_id"] for line in done if line["operation"] == "payment.charge"}
    assert charged == set(ORDER_IDS) - DECLINED


def test_submission_lines_about_an_order_name_the_order_and_the_message(run: Run) -> None:
    lines = run.order_lines("submission")
    assert not missing(lines, "order_id", "message_id")
    by_event = {line["event"]: line for line in lines}
    duplicate = by_event[RECORDED_ALREADY]
    assert (duplicate["order_id"], duplicate["message_id"]) == (ORDER_IDS[0], f"m-{ORDER_IDS[0]}")
    conflict = [line for line in lines if line.get("message_id") == CONFLICT_ID]
    assert {line["event"] for line in conflict} >= {"alert raised", "message dead-lettered"}
    assert {line["order_id"] for line in conflict} == {ORDER_IDS[1]}


def test_consumer_lines_carry_the_delivery_they_are_about(run: Run) -> None:
    """Every line written while a delivery is handled (the consumer binds `queue`) names the
    message, even when its body could not be read and so names no order."""
    for kind in ("submission", "agent"):
        handling = [line for line in run.of_kind(kind) if "queue" in line]
        assert handling, kind
        assert not missing(handling, "message_id", "message_type")
    submission = run.of_kind("submission")
    garbage = [line for line in submission if line.get("message_id") == GARBAGE_ID]
    assert {line["event"] for line in garbage} == {"message dead-lettered", "alert raised"}
    assert all(line.get("order_id") is None for line in garbage)


def test_scheduler_lines_about_an_order_name_the_order_and_the_instance(run: Run) -> None:
    lines = run.order_lines("scheduler")
    assert lines, "the declined orders' failures and compensations are logged"
    assert not missing(lines, "order_id", "instance_id")
    assert {line["order_id"] for line in lines} >= DECLINED
    assert any(line.get("step") == "charge" for line in lines), "a line about the failed step"


# -- a consumer's shared inbox round trips (group commit) name no single delivery


class _ListHandler(logging.Handler):
    """Formats each line as it is written, in the writer's context, as the processes do."""

    def __init__(self, hub: str) -> None:
        super().__init__()
        self.setFormatter(JsonFormatter(process="log-test", hub=hub))
        self.lines: list[Line] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(json.loads(self.format(record)))


class _BatchLoggingStore:
    """The real store, writing one line per inbox claim batch (as a store adapter might when it
    retries one)."""

    def __init__(self, store: PostgresStore) -> None:
        self._store = store

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    async def inbox_claim_many(self, queue: str, claims: Any, *, now: Any) -> Any:
        logging.getLogger("tests.store").info("claim batch", extra={"claims": len(claims)})
        return await self._store.inbox_claim_many(queue, claims, now=now)


@pytest.fixture
def capture(hub: str) -> Iterator[_ListHandler]:
    handler = _ListHandler(hub)
    root = logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        yield handler
    finally:
        root.removeHandler(handler)
        root.setLevel(level)


@pytest.fixture
async def store(hub: str) -> AsyncIterator[PostgresStore]:
    try:
        s = await PostgresStore.connect(
            POSTGRES_URL, hub, pool_size=5, timeout=5, command_timeout=10
        )
    except Exception as exc:
        service_missing("PostgreSQL", exc)
    await s.init()
    try:
        yield s
    finally:
        await s.drop()
        await s.close()


async def test_a_shared_inbox_round_trip_names_no_single_delivery(
    hub: str, store: PostgresStore, capture: _ListHandler
) -> None:
    try:
        connection = await connect(RABBITMQ_URL, timeout=5, name="log-tests")
    except Exception as exc:
        service_missing("RabbitMQ", exc)
    names = Names(hub)
    admin = await connection.admin()
    await declare_topology(
        admin, names, QueuePolicy(quorum=False, delivery_limit=5, orders_max_length=100)
    )
    queue = names.agent("payment")
    handled = asyncio.Event()
    seen: list[str] = []

    async def handler(delivery: Delivery) -> None:
        logging.getLogger("tests.handler").info("handling")
        seen.append(delivery.message_id)
        if len(seen) == 20:
            handled.set()

    consumer = Consumer(
        connection=connection,
        queue=queue,
        names=names,
        handler=handler,
        store=_BatchLoggingStore(store),
        dead_letter_publisher=await Publisher.open(connection, timeout=5),
        policy=ConsumerPolicy(
            prefetch=20,
            redelivery_limit=3,
            max_message_bytes=4096,
            dedupe_window=timedelta(hours=1),
            claim_ttl=timedelta(seconds=5),
            handler_timeout=5.0,
            own_user=RABBITMQ_USER,  # the messages below come from this test's own user
        ),
        holder="log-test",
    )
    try:
        publisher = await Publisher.open(connection, timeout=5)
        for i in range(20):
            order_id = f"o-batch-{i:02d}"
            message = StepReply(
                order_id=order_id,
                step="charge",
                action=StepAction.DO,
                fencing_token=f"{order_id}:1",
                idempotency_key=f"{order_id}:charge",
                outcome=StepOutcome.OK,
                attempts_used=1,
            )
            await publisher.publish(
                message, exchange=names.exchange, routing_key=queue, message_id=f"m-{i:02d}"
            )
        await consumer.start()
        await asyncio.wait_for(handled.wait(), timeout=20)
    finally:
        await consumer.stop(drain_timeout=2)
        await delete_topology(admin, names)
        await admin.close()
        await connection.close()

    handling = [line for line in capture.lines if line["event"] == "handling"]
    assert len(handling) == 20
    for line in handling:
        assert line["message_id"] == f"m-{line['order_id'][-2:]}"
        assert line["instance_id"] == f"{line['order_id']}:1" and line["step"] == "charge"
    batches = [line for line in capture.lines if line["event"] == "claim batch"]
    assert len(batches) < 20, "the claims should have shared round trips"
    for line in batches:
        assert line["queue"] == queue
        assert not {"message_id", "order_id", "instance_id", "step"} & line.keys(), line
