"""Attacks on the remote stand-in (issue 33, item 11), against the real topology's remote service
(its own process, over HTTP), as three callers: one with no key, one with another account's key,
and one holding the hub's own account key (a leaked key, or a compromised agent) who forges a
fencing token for attempt 999999 on an order id it can predict. The first two are refused and
change nothing; the third cannot advance the order's fence, and the real order ends Processed.

One topology for the module: every case uses order ids of its own.
"""

from __future__ import annotations

import secrets
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio

from shared.domain.identity import parse_instance_id
from shared.domain.states import ProcessState
from shared.remote.client import ACCOUNT_HEADER
from tests.support.topology import Topology, running_topology
from tests.support.waiting import eventually

pytestmark = [
    pytest.mark.rabbitmq,
    pytest.mark.postgres,
    pytest.mark.asyncio(loop_scope="module"),
]

OTHER = "other_shop"
"""A second account of the same remote service: the attacker holds its key."""
OTHER_KEY = secrets.token_hex(16)
OTHER_FENCE_KEY = secrets.token_hex(16)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def topo(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Topology]:
    hub = f"t{uuid.uuid4().hex[:12]}"
    workdir: Path = tmp_path_factory.mktemp("remote-attacks")
    async with running_topology(hub, workdir) as t:
        t.env["ORDERFLOW_REMOTE_ACCOUNTS"] = (
            f"{t.account_entry},{OTHER}:{OTHER_KEY}:{OTHER_FENCE_KEY}"
        )
        await t.start_all()
        yield t


async def call(
    topo: Topology,
    operation: str,
    order_id: str,
    *,
    account: str,
    key: str | None,
    token: str,
    signature: str | None = None,
    idempotency_key: str | None = None,
) -> tuple[int, Any]:
    """One call of the remote service's operation, as an outsider sends it: raw HTTP."""
    headers = {ACCOUNT_HEADER: account}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    body: dict[str, Any] = {
        "order_id": order_id,
        "idempotency_key": idempotency_key or f"{order_id}:{operation}:forged",
        "fencing_token": token,
        "payload": {"amount_cents": 1},
    }
    if signature is not None:
        body["fencing_signature"] = signature
    service, action = operation.split(".")
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{topo.remote_url}/{service}/{action}", json=body, headers=headers) as r,
    ):
        return r.status, await r.json(content_type=None)


async def nothing_recorded(topo: Topology, order_id: str) -> None:
    """No effect and no counted attempt of the order, in any account."""
    assert await topo.remote.ledger(order_id=order_id) == []
    assert await topo.remote.attempts(order_id=order_id) == []


async def test_a_call_without_a_key_is_refused_and_changes_nothing(topo: Topology) -> None:
    order_id = f"o-nokey-{uuid.uuid4().hex[:8]}"
    for operation in ("payment.charge", "inventory.release"):
        status, answer = await call(
            topo, operation, order_id, account=topo.hub, key=None, token=f"{order_id}:1"
        )
        assert status == 401, (operation, status, answer)
        status, answer = await call(
            topo, operation, order_id, account=topo.hub, key="", token=f"{order_id}:1"
        )
        assert status == 401, (operation, status, answer)
    await nothing_recorded(topo, order_id)


async def test_another_accounts_key_is_refused_and_changes_nothing(topo: Topology) -> None:
    order_id = f"o-otherkey-{uuid.uuid4().hex[:8]}"
    token = f"{order_id}:1"
    status, answer = await call(
        topo, "payment.charge", order_id, account=topo.hub, key=OTHER_KEY, token=token
    )
    assert status == 401, (status, answer)
    # The hub's own key under the other account's name: as refused.
    status, answer = await call(
        topo, "payment.charge", order_id, account=OTHER, key=topo.account_key, token=token
    )
    assert status == 401, (status, answer)
    await nothing_recorded(topo, order_id)


async def test_a_forged_fencing_token_cannot_fence_out_the_real_order(topo: Topology) -> None:
    order_id = f"o-forged-{uuid.uuid4().hex[:8]}"
    forged = f"{order_id}:999999"
    # Before the order runs, with the hub's valid account key: unsigned, signed with a made-up
    # signature, and signed with the other account's fence key (which the attacker holds).
    from shared.remote.fencing import fence_signature  # the scheme is public; the key is not

    attempts: list[tuple[str, str | None]] = [
        ("inventory.reserve", None),
        ("shipping.create", secrets.token_hex(32)),
        ("payment.charge", fence_signature(OTHER_FENCE_KEY.encode(), topo.hub, forged)),
        ("payment.charge", fence_signature(OTHER_FENCE_KEY.encode(), OTHER, forged)),
    ]
    # And a real token the hub's scheduler signed, of another order's attempt 999999 (every
    # agent sees such tokens), sent with this order's id (found by review).
    elsewhere = f"o-elsewhere-{uuid.uuid4().hex[:8]}:999999"
    attempts.append(("inventory.reserve", topo.sign(elsewhere)))
    tokens = [forged] * (len(attempts) - 1) + [elsewhere]
    for (operation, signature), token in zip(attempts, tokens, strict=True):
        status, answer = await call(
            topo,
            operation,
            order_id,
            account=topo.hub,
            key=topo.account_key,
            token=token,
            signature=signature,
        )
        assert status == 403, (operation, signature, status, answer)
    await nothing_recorded(topo, order_id)

    submitted = topo.cli("submit", "--order-id", order_id, "--json")
    assert submitted.returncode == 0, submitted.stderr

    async def settled() -> ProcessState | None:
        record = await topo.store.get_state(order_id)
        final = record is not None and record.process_state in (
            ProcessState.PROCESSED,
            ProcessState.ERROR,
            ProcessState.COMPENSATED,
            ProcessState.COMPENSATION_FAILED,
        )
        return record.process_state if final and record is not None else None

    state = await eventually(settled, timeout=60, interval=0.2, what=f"{order_id} settled")
    assert state is ProcessState.PROCESSED, state
    effects = await topo.remote.ledger(order_id=order_id)
    [token] = {e["fencing_token"] for e in effects}  # one attempt's, the first
    assert parse_instance_id(token) == (order_id, 1), effects
    assert {e["operation"] for e in effects} == {
        "inventory.reserve",
        "payment.charge",
        "shipping.create",
    }


async def test_the_hubs_own_signed_token_is_accepted(topo: Topology) -> None:
    """The control: what the refusals above refuse is the key or the signature, nothing else."""
    order_id = f"o-signed-{uuid.uuid4().hex[:8]}"
    token = f"{order_id}:1"
    status, answer = await call(
        topo,
        "inventory.reserve",
        order_id,
        account=topo.hub,
        key=topo.account_key,
        token=token,
        signature=topo.sign(token),
    )
    assert status == 200, (status, answer)
    assert answer["outcome"] == "applied"
