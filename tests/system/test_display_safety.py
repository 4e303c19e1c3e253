"""Stored and received text reaches the operator's terminal escaped: the commands, run as real
processes against the real PostgreSQL and RabbitMQ, on data written before validation refused
control characters (or that never passed it: a dead letter's raw body, its headers).

The data goes into the store directly, built with `model_construct`, so this holds whatever the
models come to refuse. NUL goes only into the dead letter: PostgreSQL text cannot hold it.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import aio_pika
import pytest

from shared.broker.consumer import DEAD_LETTERED_AT, DELIVERIES, ERROR, REASON, SOURCE_QUEUE
from shared.broker.rabbitmq.connection import connect
from shared.broker.topology import Names
from shared.domain.coordination import ComponentStatus
from shared.domain.journal import (
    Alert,
    AlertKind,
    CompensationEntry,
    HistoryEvent,
    HistoryEventType,
    Severity,
)
from shared.domain.models import Address, ErrorInfo, OrderData, OrderLine, OrderRecord
from shared.domain.states import ErrorKind, ProcessState, StepStatus
from shared.domain.timing import utcnow
from shared.domain.workflow import ORDER_WORKFLOW, new_state_record
from tests.conftest import RABBITMQ_URL
from tests.support.hostile import (
    CLEAR,
    CSI8,
    ESCAPED,
    HOSTILE,
    LINK,
    NUL,
    RLO,
    TITLE,
    assert_escaped,
    assert_harmless,
)
from tests.support.topology import Topology, running_topology
from tests.support.waiting import eventually

pytestmark = [pytest.mark.rabbitmq, pytest.mark.postgres]

ORDER = "o-hostile"
TERMINAL = {"TERM": "xterm-256color", "COLUMNS": "200"}
"""A terminal's settings: wide enough that no escaped value is folded across lines."""


@pytest.fixture
async def topo(hub: str, tmp_path: Path) -> AsyncIterator[Topology]:
    async with running_topology(hub, tmp_path) as t:  # `init` only: no process runs
        yield t


def human(topo: Topology, *args: str, styled: bool = True) -> str:
    """A command's output for a person, to a pipe and as to a terminal (FORCE_COLOR: rich
    styles it); both harmless. The piped output is returned."""
    piped = topo.cli(*args, **TERMINAL)
    assert piped.returncode == 0, piped.stdout + piped.stderr
    assert_harmless(piped.stdout)
    assert_harmless(piped.stderr)
    forced = topo.cli(*args, **TERMINAL, FORCE_COLOR="1")
    assert forced.returncode == 0, forced.stdout + forced.stderr
    if styled:
        assert "\x1b[" in forced.stdout, "rich did not believe it wrote to a terminal"
    assert_harmless(forced.stdout, styled=True)
    return piped.stdout


def as_json(topo: Topology, *args: str) -> Any:
    """`--json` output: ASCII only (json.dumps escapes every control), the data unchanged."""
    result: subprocess.CompletedProcess[str] = topo.cli(*args, "--json")
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.isascii()
    assert_harmless(result.stdout)
    return json.loads(result.stdout)


async def _write_hostile_order(topo: Topology) -> None:
    """An order, its parked state record, history, undo log, an alert and a heartbeat, with
    hostile text wherever a person reads data; written as a store writes them, unvalidated."""
    now = utcnow() - timedelta(seconds=5)
    data = OrderData.model_construct(
        order_id=ORDER,
        customer_id=f"c-{HOSTILE}",
        lines=[OrderLine(sku="sku-1", quantity=1, unit_price_cents=1250)],
        currency="EUR",
        payment_token="tok_visa_4242",
        shipping_address=Address.model_construct(
            name=f"Ada {HOSTILE}",
            line1="12 St James's Sq",
            city=f"London{RLO}",
            postal_code=f"SW1{CLEAR}",
            country="GB",
        ),
    )
    order = OrderRecord.model_construct(data=data, fingerprint=data.fingerprint(), received_at=now)
    error = ErrorInfo.model_construct(
        kind=ErrorKind.PERMANENT, message=f"{HOSTILE} card declined", at=now
    )
    pending = new_state_record(order, ORDER_WORKFLOW, now=now, retry_budget=10, reply_to=None)
    reserve = pending.steps["reserve"].model_copy(
        update={"status": StepStatus.FAILED, "attempts": 1, "error": error}
    )
    parked = pending.model_copy(
        update={
            "process_state": ProcessState.ERROR,
            "attempt": 1,
            "failure_count": 1,
            "locked_by": f"{ORDER}:1{TITLE}",
            "owner": f"scheduler{LINK}",
            "error": error,
            "steps": pending.steps | {"reserve": reserve},
        }
    )
    await topo.store.insert_order(order, parked)
    await topo.store.append_history(
        HistoryEvent.model_construct(
            order_id=ORDER,
            type=HistoryEventType.RESUBMITTED,
            at=now,
            attempt=1,
            step="reserve",
            data={"by": HOSTILE},
        )
    )
    await topo.store.append_compensation(
        CompensationEntry.model_construct(
            order_id=ORDER,
            step="reserve",
            undo=f"inventory.release{CLEAR}",
            idempotency_key=f"{ORDER}:reserve:undo{TITLE}",
            recorded_at=now,
        )
    )
    await topo.store.raise_alert(
        Alert.model_construct(
            alert_id=f"a-{ORDER}",
            kind=AlertKind.ORDER_ERROR,
            severity=Severity.CRITICAL,
            message=f"order in Error: {HOSTILE}",
            at=now,
            order_id=ORDER,
        )
    )
    await topo.store.report_status(
        ComponentStatus.model_construct(
            name=f"proc{TITLE}",
            kind=f"scheduler{CSI8}",
            at=utcnow(),
            expires_at=utcnow() + timedelta(minutes=5),
            data={"note": HOSTILE, "open_breakers": [f"inventory.reserve{RLO}"]},
        )
    )


async def test_orders_show_stored_text_escaped(topo: Topology) -> None:
    await _write_hostile_order(topo)

    listed = human(topo, "orders", "list")
    assert_escaped(listed)  # the error message, cut at 60 characters
    assert ORDER in listed
    [row] = as_json(topo, "orders", "list")["orders"]
    assert row["error"]["message"] == f"{HOSTILE} card declined"

    groups = human(topo, "orders", "list", "--group-by", "error")
    # The fingerprint (digits as `#`) of the raw message, escaped.
    assert "\\x1b]#;pwned\\x07\\x1b[#J\\x9b#m\\u202e" + LINK in groups
    [group] = as_json(topo, "orders", "list", "--group-by", "error")["groups"]
    assert group["examples"] == [ORDER]

    shown = human(topo, "orders", "show", ORDER)
    assert_escaped(shown)
    for escaped in (
        "customer c-\\x1b]0;pwned\\x07\\x1b[2J\\x9b31m\\u202e" + LINK,
        "GB SW1\\x1b[2J",  # the postal code
        f"lease: {ORDER}:1\\x1b]0;pwned\\x07 on scheduler{LINK}",
        "inventory.release\\x1b[2J",  # the undo log
    ):
        assert escaped in shown
    detail = as_json(topo, "orders", "show", ORDER)
    assert detail["order"]["customer_id"] == f"c-{HOSTILE}"
    assert detail["order"]["shipping_address"]["name"] == f"Ada {HOSTILE}"
    assert detail["state"]["locked_by"] == f"{ORDER}:1{TITLE}"

    history = human(topo, "orders", "history", ORDER)
    assert "by=\\x1b]0;pwned\\x07" in history
    assert_escaped(history)
    [event] = as_json(topo, "orders", "history", ORDER)["events"]
    assert event["data"] == {"by": HOSTILE}


async def test_alerts_and_stats_show_stored_text_escaped(topo: Topology) -> None:
    await _write_hostile_order(topo)

    alerts = human(topo, "alerts", "list")
    assert_escaped(alerts)
    [alert] = as_json(topo, "alerts", "list")["alerts"]
    assert alert["message"] == f"order in Error: {HOSTILE}"

    stats = human(topo, "stats")
    assert "proc\\x1b]0;pwned\\x07" in stats and "scheduler\\x9b31m" in stats
    assert "inventory.reserve\\u202e" in stats  # an open breaker
    assert_escaped(stats)
    assert as_json(topo, "stats")["processes"][0]["name"] == f"proc{TITLE}"
    assert_escaped(human(topo, "watch", "--count", "1"))


async def test_dead_letters_show_raw_bodies_and_headers_escaped(topo: Topology) -> None:
    names = Names(topo.hub)
    body = f"not json {HOSTILE}".encode() + NUL.encode() + b"\xff\xfe" + "\u2028".encode()
    headers = {
        REASON: "malformed",
        ERROR: f"{HOSTILE}{NUL} bad body",  # within the 60 characters `dlq list` shows
        SOURCE_QUEUE: names.orders,
        DEAD_LETTERED_AT: utcnow().isoformat(),
        DELIVERIES: 1,
        "x-note": f"{HOSTILE}{NUL}",
    }
    connection = await connect(RABBITMQ_URL, timeout=5, name="display-safety-test")
    try:
        channel = await connection.channel()
        exchange = await channel.get_exchange(names.dead_letters)
        message = aio_pika.Message(
            body, message_id="dl-hostile", type=f"order.submit{CLEAR}", headers=headers
        )
        await exchange.publish(message, routing_key=names.orders)
    finally:
        await connection.close()

    async def dead_lettered() -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = as_json(topo, "dlq", "list")["messages"]
        return rows

    [row] = await eventually(dead_lettered, timeout=10, what="the dead letter in the DLQ")
    assert row["error"] == f"{HOSTILE}{NUL} bad body" and row["type"] == f"order.submit{CLEAR}"

    listed = human(topo, "dlq", "list")
    assert "order.submit\\x1b[2J" in listed
    assert_escaped(listed)
    assert "\\x00" in listed

    shown = human(topo, "dlq", "show", "dl-hostile", styled=False)
    assert_escaped(shown)
    assert f"body: not json {ESCAPED[0]}" in shown
    assert "\\x00\ufffd\ufffd\\u2028" in shown  # NUL, the bytes that are not UTF-8, U+2028
    assert f"reason: malformed: {ESCAPED[0]}" in shown
    [detail] = as_json(topo, "dlq", "show", "dl-hostile")["messages"]
    assert detail["body"] == body.decode("utf-8", errors="replace")
    assert detail["headers"]["x-note"] == f"{HOSTILE}{NUL}"
