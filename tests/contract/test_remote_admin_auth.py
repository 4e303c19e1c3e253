"""The remote stand-in's operator endpoints (`/admin/...`, `/ledger`) answer only the bearer token
configured for them, and refuse everything when none is; the calls the agents make need their
account's key instead (tests/attacks/test_remote.py), and `/health` stays open. In-process, over
real HTTP."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from harness.remote.admin import authorised, is_guarded
from harness.remote.app import Faults, RemoteService
from harness.remote.ledger import Ledger
from shared.errors import RemoteRejected
from shared.remote.admin import admin_token
from shared.remote.client import RemoteClient
from tests.support.remote_service import SigningClient, accounts_of
from tests.support.topology import free_port

TOKEN = "s3cret-token-for-this-test"
GUARDED = [("GET", "/ledger"), ("GET", "/admin/faults"), ("PUT", "/admin/faults")]
GUARDED += [("GET", "/admin/stats"), ("GET", "/attempts")]


async def _serve(tmp_path: Path, token: str | None) -> AsyncIterator[str]:
    service = RemoteService(
        Ledger(str(tmp_path / "ledger.sqlite3")),
        Faults(),
        random.Random(1),
        admin_token=token,
        accounts=accounts_of("hub_a"),
    )
    runner = web.AppRunner(service.app())
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()
        service.ledger.close()


@pytest.fixture
async def guarded(tmp_path: Path) -> AsyncIterator[str]:
    async for url in _serve(tmp_path, TOKEN):
        yield url


@pytest.fixture
async def unconfigured(tmp_path: Path) -> AsyncIterator[str]:
    async for url in _serve(tmp_path, None):
        yield url


async def _status(url: str, method: str, path: str, headers: dict[str, str]) -> int:
    async with aiohttp.ClientSession() as session:
        body = {"outage": True} if method == "PUT" else None
        async with session.request(method, url + path, json=body, headers=headers) as response:
            return response.status


@pytest.mark.parametrize(("method", "path"), GUARDED)
async def test_an_operator_endpoint_answers_only_the_configured_token(
    guarded: str, method: str, path: str
) -> None:
    assert await _status(guarded, method, path, {}) == 401
    assert await _status(guarded, method, path, {"Authorization": "Bearer wrong"}) == 401
    assert await _status(guarded, method, path, {"Authorization": TOKEN}) == 401  # no scheme
    good = {"Authorization": f"Bearer {TOKEN}"}
    assert await _status(guarded, method, path, good) == 200


async def test_a_refused_outage_switch_changes_nothing(guarded: str) -> None:
    anonymous = RemoteClient.open(guarded)
    operator = RemoteClient.open(guarded, admin_token=TOKEN)
    try:
        with pytest.raises(RemoteRejected, match="ORDERFLOW_REMOTE_ADMIN_TOKEN"):
            await anonymous.set_faults(outage=True)
        with pytest.raises(RemoteRejected, match="HTTP 401"):
            await anonymous.ledger()
        assert (await operator.faults())["outage"] is False
        assert await operator.ledger() == []
    finally:
        await anonymous.close()
        await operator.close()


@pytest.mark.parametrize(("method", "path"), GUARDED)
async def test_without_a_configured_token_the_operator_endpoints_are_off(
    unconfigured: str, method: str, path: str
) -> None:
    assert await _status(unconfigured, method, path, {}) == 403
    # Not even an empty bearer token opens them.
    assert await _status(unconfigured, method, path, {"Authorization": "Bearer "}) == 403


async def test_the_agents_operations_need_their_accounts_key_not_the_token(
    guarded: str,
) -> None:
    client = SigningClient.of(guarded, "hub_a", admin_token=None)
    try:
        result = await client.call(
            "inventory.reserve",
            order_id="o-1",
            idempotency_key="k-1",
            fencing_token="o-1:1",
            payload={},
            timeout=5,
        )
        assert result["outcome"] == "applied"
    finally:
        await client.close()
    # The operator's token is no account's key.
    refused = {"Authorization": f"Bearer {TOKEN}", "X-Orderflow-Account": "hub_a"}
    assert await _status(guarded, "POST", "/inventory/reserve", refused) == 401
    assert await _status(guarded, "GET", "/health", {}) == 200


def test_the_guard_covers_admin_ledger_and_attempts_only() -> None:
    assert is_guarded("/ledger") and is_guarded("/admin/faults") and is_guarded("/admin")
    assert is_guarded("/attempts") and not is_guarded("/attempts/x")
    assert not is_guarded("/health") and not is_guarded("/inventory/reserve")
    assert not is_guarded("/ledgers") and not is_guarded("/administrator")
    assert authorised(f"Bearer {TOKEN}", TOKEN)
    assert not authorised(f"bearer {TOKEN}", TOKEN) and not authorised(None, TOKEN)
    assert not authorised(f"Bearer {TOKEN}x", TOKEN)


def test_the_token_is_read_from_the_environment_or_the_secrets_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("ORDERFLOW_REMOTE_ADMIN_TOKEN", raising=False)
    monkeypatch.delenv("ORDERFLOW_SECRETS_DIR", raising=False)
    assert admin_token() is None
    (tmp_path / "orderflow_remote_admin_token").write_text("from-a-file\n")
    monkeypatch.setenv("ORDERFLOW_SECRETS_DIR", str(tmp_path))
    assert admin_token() == "from-a-file"
    monkeypatch.setenv("ORDERFLOW_REMOTE_ADMIN_TOKEN", "from-the-environment")
    assert admin_token() == "from-the-environment"
