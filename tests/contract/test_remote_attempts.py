"""The remote stand-in: it counts every call, whatever it answers, and an undo commutes with the
call it undoes (issue 14). In-process over real HTTP, its ledger in a file."""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from shared.errors import (
    RemoteDeclined,
    RemoteFenced,
    RemoteRejected,
    RemoteTransient,
    RemoteUndone,
)
from shared.remote.client import RemoteClient
from tests.support.remote_service import InProcessRemote
from tests.support.waiting import eventually


@pytest.fixture
async def remote(tmp_path: Path) -> AsyncIterator[InProcessRemote]:
    r = InProcessRemote(tmp_path / "ledger.sqlite3")
    await r.start()
    yield r
    await r.stop()


@pytest.fixture
async def client(remote: InProcessRemote) -> AsyncIterator[RemoteClient]:
    c = remote.client(account="hub_a")
    yield c
    await c.close()


def call(
    client: RemoteClient, operation: str, order_id: str, token: str, *, timeout: float = 5
) -> Any:
    step = {"payment.charge": "charge", "payment.refund": "charge:undo"}.get(operation, operation)
    return client.call(
        operation,
        order_id=order_id,
        idempotency_key=f"{order_id}:{step}",
        fencing_token=token,
        payload={"amount_cents": 100},
        timeout=timeout,
    )


async def outcomes(client: RemoteClient, order_id: str) -> list[tuple[str, str]]:
    return [(a["operation"], a["outcome"]) for a in await client.attempts(order_id=order_id)]


async def test_every_call_is_counted_whatever_it_was_answered(
    remote: InProcessRemote, client: RemoteClient
) -> None:
    faults = remote.service.faults
    faults.outage = True
    with pytest.raises(RemoteTransient):
        await call(client, "payment.charge", "o-1", "o-1:1")
    faults.outage, faults.transient_error_rate = False, 1.0
    with pytest.raises(RemoteTransient):
        await call(client, "payment.charge", "o-1", "o-1:1")
    faults.transient_error_rate, faults.reject_operations = 0.0, ["payment.charge"]
    with pytest.raises(RemoteRejected):
        await call(client, "payment.charge", "o-1", "o-1:1")
    faults.reject_operations = []
    await call(client, "payment.charge", "o-1", "o-1:2")
    await call(client, "payment.charge", "o-1", "o-1:2")  # the same key: replayed
    with pytest.raises(RemoteFenced):
        await call(client, "payment.refund", "o-1", "o-1:1")
    faults.decline_rate = 1.0
    with pytest.raises(RemoteDeclined):
        await call(client, "payment.charge", "o-2", "o-2:1")
    assert await outcomes(client, "o-1") == [
        ("payment.charge", "outage"),
        ("payment.charge", "transient"),
        ("payment.charge", "rejected"),
        ("payment.charge", "applied"),
        ("payment.charge", "replayed"),
        ("payment.refund", "fenced"),
    ]
    assert await outcomes(client, "o-2") == [("payment.charge", "declined")]
    [first, *_] = await client.attempts(order_id="o-1")
    assert first["fencing_token"] == "o-1:1" and first["idempotency_key"] == "o-1:charge"
    assert first["answered_at"] is not None and first["hung"] is False

    # Durable, and scoped by account like the effects.
    await remote.stop()
    await remote.start()
    assert len(await client.attempts(order_id="o-1")) == 6
    assert len(await client.attempts(account="hub_a")) == 7
    assert await client.attempts(account="hub_b") == []


async def test_a_hung_call_is_counted_when_it_arrives(
    remote: InProcessRemote, client: RemoteClient
) -> None:
    remote.service.faults.hang_rate, remote.service.faults.hang_s = 1.0, 2.0
    with pytest.raises(RemoteTransient):  # the caller gives up; the call hangs on
        await call(client, "payment.charge", "o-3", "o-3:1", timeout=0.2)
    [attempt] = await client.attempts(order_id="o-3")
    assert attempt["outcome"] == "unanswered" and attempt["answered_at"] is None


async def test_an_undo_recorded_first_refuses_its_call_when_the_call_wakes(
    remote: InProcessRemote, client: RemoteClient
) -> None:
    """A forward call hangs inside the service; its undo comes, under the same fencing token
    (the attempt that sent it compensated), and is a no-op; then the call wakes. It must not
    make its effect: nothing would ever undo it."""
    faults = remote.service.faults
    faults.hang_rate, faults.hang_s = 1.0, 1.0
    hung = asyncio.create_task(call(client, "payment.charge", "o-4", "o-4:1", timeout=10))

    async def hanging() -> bool:
        return bool(await client.attempts(order_id="o-4"))

    await eventually(hanging, what="the forward call hanging inside the service")
    faults.hang_rate = 0.0
    undo = await call(client, "payment.refund", "o-4", "o-4:1")
    assert undo["outcome"] == "noop"
    with pytest.raises(RemoteUndone):
        await hung
    assert [(e["operation"], e["outcome"]) for e in await client.ledger(order_id="o-4")] == [
        ("payment.refund", "noop")
    ]
    assert await outcomes(client, "o-4") == [
        ("payment.charge", "undone"),
        ("payment.refund", "noop"),
    ]
    assert (await client.attempts(order_id="o-4"))[0]["hung"] is True
    # Any later call of the step is refused too; a repeat of the undo is its first outcome.
    with pytest.raises(RemoteUndone):
        await call(client, "payment.charge", "o-4", "o-4:2")
    assert (await call(client, "payment.refund", "o-4", "o-4:2"))["replayed"]


async def test_an_effect_made_before_its_undo_is_undone_and_still_replayed(
    client: RemoteClient,
) -> None:
    charge = await call(client, "payment.charge", "o-5", "o-5:1")
    refund = await call(client, "payment.refund", "o-5", "o-5:1")
    assert (refund["outcome"], refund["result"]["undid"]) == ("applied", charge["seq"])
    again = await call(client, "payment.charge", "o-5", "o-5:1")
    assert again["replayed"] and again["seq"] == charge["seq"]


async def test_concurrent_calls_and_undos_never_leave_an_effect_after_its_undo(
    remote: InProcessRemote, client: RemoteClient
) -> None:
    """Many orders, each with a forward call that may hang and an undo racing it: either the
    call made its effect first and the undo undid it, or the undo found nothing and the call
    made none."""
    faults = remote.service.faults
    faults.hang_rate, faults.hang_s = 0.5, 0.3

    async def race(i: int) -> None:
        order_id = f"o-r{i}"
        forward = asyncio.create_task(call(client, "payment.charge", order_id, f"{order_id}:1"))
        with contextlib.suppress(RemoteUndone):
            await call(client, "payment.refund", order_id, f"{order_id}:1")
        with contextlib.suppress(RemoteUndone):
            await forward

    await asyncio.gather(*(race(i) for i in range(40)))
    effects = await client.ledger(account="hub_a")
    by_order: dict[str, list[dict[str, Any]]] = {}
    for effect in effects:
        by_order.setdefault(effect["order_id"], []).append(effect)
    seen: Counter[str] = Counter()
    for order_id, made in by_order.items():
        kinds = [(e["operation"], e["outcome"]) for e in made]
        if ("payment.charge", "applied") in kinds:
            assert kinds == [("payment.charge", "applied"), ("payment.refund", "applied")]
            seen["undone"] += 1
        else:
            assert kinds == [("payment.refund", "noop")], order_id
            seen["overtaken"] += 1
    assert sum(seen.values()) == 40
    assert seen["undone"] and seen["overtaken"], f"both orders of events happened: {seen}"
