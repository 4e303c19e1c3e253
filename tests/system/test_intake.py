"""Intake that nothing can stall, through the real processes on the real RabbitMQ and PostgreSQL.

The generator of tests/support/bodies.py (any bytes, any JSON, contract-shaped documents with a
part replaced, textual tricks) publishes bursts on `<hub>.submit` as a hostile client would.
Every message is dead-lettered with the reason `decode` gives it, or handled, at its first
delivery; nothing waits in the queue or its retry queue afterwards; and a valid order published
right after a burst is Processed within seconds. `ORDERFLOW_TEST_INTAKE_EXAMPLES` sets how many
bursts hypothesis tries (3 by default, to bound CI's time).

And intake is observable: when submission's consumer stops (the broker cancels it), `/healthz`
fails on `intake` and the heartbeat says `not-subscribed`.
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import aio_pika
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shared.broker.consumer import REASON
from shared.broker.port import Outgoing
from shared.broker.publisher import Publisher
from shared.broker.rabbitmq import connect as connect_port
from shared.broker.rabbitmq.connection import connect
from shared.broker.topology import Names
from shared.domain.states import ProcessState
from shared.domain.timing import utcnow
from tests.conftest import RABBITMQ_URL
from tests.support.bodies import expected_outcome, hostile_messages, sample_contracts, type_property
from tests.support.topology import Topology, free_port, running_topology
from tests.support.waiting import eventually

pytestmark = [pytest.mark.rabbitmq, pytest.mark.postgres]

EXAMPLES = int(os.environ.get("ORDERFLOW_TEST_INTAKE_EXAMPLES", "3"))
LIMIT = 64 * 1024


@pytest.fixture
async def topo(hub: str, tmp_path: Path) -> AsyncIterator[Topology]:
    async with running_topology(hub, tmp_path) as t:
        await t.start_all()
        yield t


async def dead_letters(
    topo: Topology, queue: str
) -> dict[str, aio_pika.abc.AbstractIncomingMessage]:
    connection = await connect(RABBITMQ_URL, timeout=5, name="intake-test")
    try:
        channel = await connection.channel()
        dlq = await channel.get_queue(Names.dlq(queue))
        got = {}
        while (message := await dlq.get(no_ack=True, fail=False)) is not None:
            got[str(message.message_id)] = message
        return got
    finally:
        await connection.close()


async def ready(queue: str) -> int:
    connection = await connect(RABBITMQ_URL, timeout=5, name="intake-test")
    try:
        channel = await connection.channel()
        declared = await channel.declare_queue(queue, passive=True)
        return int(declared.declaration_result.message_count or 0)
    finally:
        await connection.close()


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
    ],
)
@given(burst=st.lists(hostile_messages(), min_size=20, max_size=60))
async def test_any_burst_is_dead_lettered_or_handled_at_first_delivery_and_intake_goes_on(
    topo: Topology, burst: list[tuple[str | None, bytes]]
) -> None:
    names = Names(topo.hub)
    connection = await connect_port(RABBITMQ_URL, timeout=5, name="hostile-client")
    publisher = await Publisher.open(connection, timeout=10)
    expected: dict[str, str] = {}
    try:
        for type_name, body in burst:
            message_id = f"burst-{uuid.uuid4().hex}"
            kind = type_property(type_name)
            expected[message_id] = expected_outcome(kind, body)
            await publisher.publish_raw(
                Outgoing(body, message_id=message_id, type=kind),
                exchange=names.submit,
                routing_key="",
            )
        # A valid order right behind the burst.
        order_id = f"after-{uuid.uuid4().hex[:12]}"
        good = sample_contracts(order_id)[0]
        published = time.monotonic()
        await publisher.publish(good, exchange=names.submit, routing_key="", message_id=order_id)
    finally:
        await connection.close()

    async def processed() -> bool:
        state = await topo.store.get_state(order_id)
        return state is not None and state.process_state is ProcessState.PROCESSED

    await eventually(processed, timeout=60, interval=0.1, what="the order behind the burst")
    print(
        f"order behind {len(burst)} generated messages Processed after "
        f"{time.monotonic() - published:.2f} s"
    )

    async def drained() -> dict[str, aio_pika.abc.AbstractIncomingMessage] | None:
        dead = await dead_letters(topo, names.orders)
        refused = {m for m, outcome in expected.items() if outcome != "handled"}
        return dead if refused <= set(dead) else None

    dead = await eventually(drained, timeout=30, what="every refused message dead-lettered")
    for message_id, outcome in expected.items():
        letter = dead.get(message_id)
        if outcome == "handled":
            assert letter is None or letter.headers[REASON] == "conflict", message_id
        else:
            assert letter is not None, message_id
            assert letter.headers[REASON] == outcome, (message_id, letter.headers)
        if letter is not None:  # refused at its first delivery: never requeued, never retried
            assert letter.headers["x-orderflow-deliveries"] == 1
    assert await ready(names.orders) == 0
    assert await ready(names.retry(names.orders)) == 0


def _healthz(port: int) -> tuple[int, dict[str, object]]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


async def test_healthz_and_the_heartbeat_say_when_submission_stops_consuming(
    hub: str, tmp_path: Path
) -> None:
    port = free_port()
    async with running_topology(hub, tmp_path, ORDERFLOW_HEARTBEAT_S="0.5") as topo:
        topo.serve("submission", "submission", ORDERFLOW_METRICS_PORT=str(port))

        async def healthy() -> bool:
            # Healthy with its consumer attached: /healthz answers 200 from the moment the
            # broker and the store are reached, and reports intake only once a consumer is.
            try:
                code, body = _healthz(port)
            except OSError:
                return False
            return code == 200 and "intake" in body["checks"]

        await eventually(healthy, timeout=30, what="submission healthy, its intake reported")
        _, body = _healthz(port)
        assert body["checks"] == {"broker": True, "store": True, "intake": True}

        connection = await connect(RABBITMQ_URL, timeout=5, name="intake-test")
        try:  # the broker cancels submission's consumer with its queue
            await (await connection.channel()).queue_delete(Names(hub).orders)
        finally:
            await connection.close()

        async def unhealthy() -> dict[str, object] | None:
            code, answer = _healthz(port)
            return answer if code == 503 else None

        answer = await eventually(unhealthy, timeout=15, what="/healthz failing")
        assert answer["checks"] == {"broker": True, "store": True, "intake": False}

        async def reported() -> list[dict[str, object]] | None:
            statuses = await topo.store.list_status(now=utcnow())
            mine = [s for s in statuses if s.kind == "submission"]
            intake = mine[0].data.get("intake") if mine else None
            return intake if intake and intake[0]["state"] == "not-subscribed" else None

        intake = await eventually(reported, timeout=15, what="the heartbeat saying so")
        assert intake[0]["queue"] == Names(hub).orders

        # And the operator sees it in `orderflow stats`.
        shown = json.loads(topo.cli("stats", "--json").stdout)
        (consumer,) = [i for i in shown["intake"] if i["queue"] == Names(hub).orders]
        assert consumer["state"] == "not-subscribed"
        assert consumer["process"] == f"{hub}-submission"
        human = topo.cli("stats", COLUMNS="200").stdout
        assert "intake STOPPED" in human and "not-subscribed" in human
