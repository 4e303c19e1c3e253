"""The remote service called in process, without HTTP: what the simulation's agents call.

It answers exactly what `RemoteService.answer` answers over HTTP, read by the HTTP client's own
`interpret`, and keeps HTTP's timing: a caller that gives up on a slow or hung call leaves the
call running in the service (as a server keeps running a request whose client went away), so
its effect may still be made after the caller stopped waiting. The caller is the account it
was made for, with no key to show (there is no wire to reach it from), but its fencing tokens
are checked as over HTTP: they must carry their scheduler's signature. It can be down, as a real
service can: a crash loses the calls in progress (they stay unanswered in the ledger) and
refuses new ones until it is back.
"""

from __future__ import annotations

import asyncio
import contextvars
from typing import Any

from pydantic import ValidationError

from harness.remote.app import OPERATIONS, RemoteCall, RemoteService
from shared.errors import RemoteRejected, RemoteTransient
from shared.remote.client import interpret


class LocalRemote:
    def __init__(
        self,
        service: RemoteService,
        *,
        account: str = "",
        context: contextvars.Context | None = None,
    ) -> None:
        """`context`: the service's own (its clock), in which every call runs, apart from the
        caller's: a call outlives a caller that gives up or dies, as over a socket."""
        self.service = service
        self.account = account
        self._context = context
        self.up = True
        self._calls: set[asyncio.Task[tuple[dict[str, Any], int]]] = set()

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
        if not self.up:
            raise RemoteTransient(f"{operation}: ClientConnectorError connection refused")
        if operation not in OPERATIONS:
            raise RemoteRejected(f"{operation}: HTTP 404 no operation {operation}")
        try:
            body = RemoteCall(
                order_id=order_id,
                idempotency_key=idempotency_key,
                fencing_token=fencing_token,
                fencing_signature=fencing_signature,
                payload=payload,
            )
        except ValidationError as exc:
            raise RemoteRejected(f"{operation}: HTTP 400 {exc.errors()[:3]}") from exc
        context = self._context.copy() if self._context is not None else None
        call = asyncio.create_task(
            self.service.answer(self.account, operation, body), context=context
        )
        self._calls.add(call)
        call.add_done_callback(self._calls.discard)
        try:
            answer, status = await asyncio.wait_for(asyncio.shield(call), timeout)
        except TimeoutError as exc:
            raise RemoteTransient(f"{operation}: TimeoutError") from exc
        return interpret(operation, status, answer)

    async def close(self) -> None:
        """Nothing to release: no connections."""

    def crash(self) -> None:
        """The service dies: every call in progress ends unanswered, new ones are refused."""
        self.up = False
        for call in list(self._calls):
            call.cancel()

    def restart(self) -> None:
        self.up = True

    async def ledger(
        self, *, order_id: str | None = None, account: str | None = None
    ) -> list[dict[str, Any]]:
        """Every effect (or one order's), in ledger order, as `GET /ledger` lists them."""
        ledger = self.service.ledger
        if order_id is not None:
            return [e.to_json() for e in ledger.effects_of(account, order_id)]
        return [e.to_json() for e in ledger.page(after=0, limit=2**62, account=account)]

    async def attempts(
        self, *, order_id: str | None = None, account: str | None = None
    ) -> list[dict[str, Any]]:
        """Every call the service was asked (or one order's), as `GET /attempts` lists them."""
        ledger = self.service.ledger
        if order_id is not None:
            return [a.to_json() for a in ledger.attempts_of(account, order_id)]
        return [a.to_json() for a in ledger.attempts_page(after=0, limit=2**62, account=account)]
