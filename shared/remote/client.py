"""An HTTP client of the remote service: what agents call, and what audits read."""

from __future__ import annotations

import json
from typing import Any, Protocol

import aiohttp

from shared.errors import (
    RemoteDeclined,
    RemoteFenced,
    RemoteRefused,
    RemoteRejected,
    RemoteTransient,
    RemoteUndone,
    one_line,
)

ACCOUNT_HEADER = "X-Orderflow-Account"
"""Who calls: the calling deployment's task hub. The remote service scopes idempotency keys,
orders and fencing tokens by it, as a payment provider scopes them by API key, so two hubs that
share one remote service never share an effect. No header: the unnamed account. A call carries
the account's key too (`Authorization: Bearer <key>`, harness/remote/accounts.py)."""


class RemoteCalls(Protocol):
    """What an agent needs of the remote service: one call (over HTTP, `RemoteClient`, or in
    process, harness/remote/local.py)."""

    async def call(
        self,
        operation: str,
        *,
        order_id: str,
        idempotency_key: str,
        fencing_token: str,
        fencing_signature: str | None,
        payload: dict[str, Any],
        timeout: float,
    ) -> dict[str, Any]:
        """The effect's result; a `RemoteError` subclass says why there is none.
        `fencing_signature`: the scheduler's signature of the token (harness/remote/fencing)."""

    async def close(self) -> None: ...


def path_of(operation: str) -> str:
    service, _, action = operation.partition(".")
    return f"/{service}/{action}"


class RemoteClient:
    """One pooled HTTP session; every call carries its own timeout."""

    def __init__(
        self,
        base_url: str,
        session: aiohttp.ClientSession,
        *,
        admin_token: str | None = None,
        account_key: str | None = None,
    ) -> None:
        self._base = base_url.rstrip("/")
        self._session = session
        # Sent only to the operator endpoints (`/admin/...`, `/ledger`), never with a call.
        self._admin = {"Authorization": f"Bearer {admin_token}"} if admin_token else {}
        # Sent only with a call, never to the operator endpoints.
        self._key = {"Authorization": f"Bearer {account_key}"} if account_key else {}

    @classmethod
    def open(
        cls,
        base_url: str,
        *,
        pool: int = 100,
        account: str = "",
        account_key: str | None = None,
        admin_token: str | None = None,
        trace_configs: list[Any] | None = None,
    ) -> RemoteClient:
        """A client calling as `account` (the deployment's task hub; see ACCOUNT_HEADER) with
        its key; with `admin_token`, it may also read the ledger and the fault knobs
        (harness/remote/admin)."""
        connector = aiohttp.TCPConnector(limit=pool, keepalive_timeout=30)
        headers = {ACCOUNT_HEADER: account} if account else None
        session = aiohttp.ClientSession(
            connector=connector, headers=headers, trace_configs=trace_configs
        )
        return cls(base_url, session, admin_token=admin_token, account_key=account_key)

    async def close(self) -> None:
        await self._session.close()

    async def call(
        self,
        operation: str,
        *,
        order_id: str,
        idempotency_key: str,
        fencing_token: str,
        fencing_signature: str | None,
        payload: dict[str, Any],
        timeout: float,
    ) -> dict[str, Any]:
        body = {
            "order_id": order_id,
            "idempotency_key": idempotency_key,
            "fencing_token": fencing_token,
            "payload": payload,
        }
        if fencing_signature is not None:
            body["fencing_signature"] = fencing_signature
        try:
            async with self._session.post(
                self._base + path_of(operation),
                json=body,
                headers=self._key,
                timeout=aiohttp.ClientTimeout(total=timeout),
            ) as response:
                status = response.status
                text = await response.text()
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            raise RemoteTransient(f"{operation}: {type(exc).__name__} {one_line(exc)}") from exc
        return interpret(operation, status, _json(text))

    async def ledger(
        self, *, order_id: str | None = None, account: str | None = None
    ) -> list[dict[str, Any]]:
        """Every effect (or one order's), in ledger order: of one account, or of all."""
        return await self._listing("/ledger", "effects", order_id=order_id, account=account)

    async def attempts(
        self, *, order_id: str | None = None, account: str | None = None
    ) -> list[dict[str, Any]]:
        """Every call the service was asked (or one order's), in arrival order, with what it
        answered: of one account, or of all."""
        return await self._listing("/attempts", "attempts", order_id=order_id, account=account)

    async def _listing(
        self, path: str, key: str, *, order_id: str | None, account: str | None
    ) -> list[dict[str, Any]]:
        scope = {} if account is None else {"account": account}
        if order_id is not None:
            page = await self._get(path, order_id=order_id, **scope)
            return list(page[key])
        rows: list[dict[str, Any]] = []
        after = 0
        while True:
            page = await self._get(path, after=str(after), limit="10000", **scope)
            batch = page[key]
            rows += batch
            if len(batch) < 10000:
                return rows
            after = batch[-1]["seq"]

    async def stats(self) -> dict[str, Any]:
        return await self._get("/admin/stats")

    async def faults(self) -> dict[str, Any]:
        return await self._get("/admin/faults")

    async def set_faults(self, **changes: Any) -> dict[str, Any]:
        async with self._session.put(
            self._base + "/admin/faults",
            json=changes,
            headers=self._admin,
            timeout=aiohttp.ClientTimeout(total=10),
        ) as response:
            data: dict[str, Any] = await response.json()
            _refused(response.status, "/admin/faults", data)
            if response.status != 200:
                raise RemoteRejected(str(data.get("error")))
            return data

    async def _get(self, path: str, **params: str) -> dict[str, Any]:
        try:
            async with self._session.get(
                self._base + path,
                params=params,
                headers=self._admin,
                timeout=aiohttp.ClientTimeout(total=30),
            ) as response:
                if response.status in (401, 403):
                    _refused(response.status, path, await response.json())
                response.raise_for_status()
                data: dict[str, Any] = await response.json()
                return data
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            raise RemoteTransient(f"remote service at {self._base}: {one_line(exc)}") from exc


def _refused(status: int, path: str, data: dict[str, Any]) -> None:
    """An operator endpoint refused this client: no token, or not the one configured."""
    if status in (401, 403):
        raise RemoteRejected(
            f"the remote service refused {path} (HTTP {status}: {data.get('error', '')}); "
            "set ORDERFLOW_REMOTE_ADMIN_TOKEN to the remote service's token"
        )


def _json(text: str) -> dict[str, Any]:
    try:
        data = json.loads(text) if text else {}
    except json.JSONDecodeError:
        return {"error": text[:200]}
    return data if isinstance(data, dict) else {"error": text[:200]}


def interpret(operation: str, status: int, data: dict[str, Any]) -> dict[str, Any]:
    """A call's answer as its result, or the error that says what the agent makes of it."""
    if status == 200:
        return dict(data)
    if status == 422:
        raise RemoteDeclined(f"{operation} declined: {data.get('result', {}).get('reason')}")
    if status == 409:
        raise RemoteFenced(f"{operation}: {data.get('error', 'stale fencing token')}")
    if status == 410:
        raise RemoteUndone(f"{operation}: {data.get('error', 'undone')}")
    if status in (401, 403):
        raise RemoteRefused(f"{operation}: HTTP {status} {data.get('error', '')}".strip())
    if status >= 500 or status == 429:
        raise RemoteTransient(f"{operation}: HTTP {status} {data.get('error', '')}".strip())
    raise RemoteRejected(f"{operation}: HTTP {status} {data.get('error', '')}".strip())
