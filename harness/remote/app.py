"""The simulated remote service: inventory, payment and shipping over HTTP, with fault knobs.

`POST /<service>/<action>` with `{"order_id", "idempotency_key", "fencing_token",
"fencing_signature", "payload"}`, as an account (`X-Orderflow-Account`, with its key as
`Authorization: Bearer <key>`: harness/remote/accounts.py):
- 401 `{"error"}`: no key, an unknown account, or not the account's key; nothing read or counted
- 403 `{"outcome": "forged-fencing-token"}`: the token's signature does not check (a token no
  scheduler of the account signed: shared/remote/fencing.py); nothing counted or applied
- 200 `{"outcome": "applied"|"noop", "result", "seq", "replayed"}`
- 422 `{"outcome": "declined", ...}`: a permanent business failure (same answer on every repeat)
- 409 `{"outcome": "stale-fencing-token"}`: the attempt was superseded
- 410 `{"outcome": "undone"}`: an undo of this operation is recorded for the order, so the call
  may no longer make its effect (it arrived, or woke from a hang, after its undo)
- 400 `{"outcome": "rejected"}`: refused (the `reject_operations` knob); no effect, and not the
  key's outcome: the same call may pass once the knob is cleared
- 503 `{"error": "transient"|"outage"}`: try again later; no effect was made
`GET /ledger?account=&order_id=&after=&limit=`, `GET /attempts?account=&order_id=&after=&limit=`,
`GET|PUT /admin/faults`, `GET /admin/stats` (these need the operator's bearer token:
harness/remote/admin.py), `GET /health` (open).

What orderflow asks of a real remote service, and this stand-in does
(docs/concepts/processes.md, "The remote service"): one effect per idempotency key, the first
outcome returned to every repeat; fencing
tokens that only move forward per order (and one token per attempt number: the first to make an
effect owns it); and an undo that commutes with the call it undoes: an
undo recorded for an (order, operation), even one that found nothing to undo, refuses every later
effect of that operation for the order. A compensation may overtake its own step's call (a call
hung inside the service while the attempt that sent it gave up and compensated under the same
fencing token), and only the service can order the two. The stand-in also counts every call it
is asked, per (order, operation, fencing token), whatever it answers (`GET /attempts`), which is
what `orderflow audit` holds against each order's retry budget: a real service's request log, or
the agents' own metrics, would serve the same end.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import random
from collections import Counter
from dataclasses import asdict, dataclass, field, fields
from typing import Annotated, Any

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError

from harness.remote.accounts import (
    ACCOUNT,
    CHALLENGE,
    UNAUTHENTICATED,
    Accounts,
    forged,
)
from harness.remote.admin import admin_guard
from harness.remote.ledger import UNANSWERED, Effect, Ledger
from shared.config import RemoteStandInSettings
from shared.errors import StaleFencingToken, Undone
from shared.remote.client import ACCOUNT_HEADER
from shared.remote.payments import DECLINED_TEST_TOKEN

log = logging.getLogger(__name__)

UNDO_OF: dict[str, tuple[str, ...]] = {
    "inventory.release": ("inventory.reserve",),
    "payment.refund": ("payment.charge", "payment.capture"),
    "payment.void": ("payment.authorize",),
    "shipping.cancel": ("shipping.create",),
}
"""Each undo and the operations it undoes (an undo with nothing to undo is a no-op)."""
UNDONE_BY: dict[str, tuple[str, ...]] = {
    op: tuple(undo for undo, done in UNDO_OF.items() if op in done)
    for done in UNDO_OF.values()
    for op in done
}
"""Each operation and the undos whose record refuses its effect from then on."""
OPERATIONS = frozenset({*UNDO_OF, *UNDONE_BY})
DECLINABLE = frozenset({"payment.charge", "payment.authorize"})
"""Where a card is declined: the charge (workflow v1) or the authorization (v2)."""


class RemoteCall(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")
    order_id: Annotated[str, StringConstraints(min_length=1, max_length=64)]
    idempotency_key: Annotated[str, StringConstraints(min_length=1, max_length=140)]
    fencing_token: Annotated[str, StringConstraints(min_length=1, max_length=100)]
    fencing_signature: Annotated[str, StringConstraints(max_length=200)] | None = None
    """The token's signature by the scheduler that holds it (shared/remote/fencing.py)."""
    payload: dict[str, Any] = Field(default_factory=dict)


@dataclass
class Faults:
    transient_error_rate: float = 0.0
    latency_ms: float = 0.0
    hang_rate: float = 0.0
    hang_s: float = 30.0
    decline_rate: float = 0.0
    outage: bool = False
    fail_operations: list[str] = field(default_factory=list)
    reject_operations: list[str] = field(default_factory=list)
    """Operations refused with 400 (a permanent refusal that, unlike a decline, is no outcome of
    the key) until cleared; set at run time only (`PUT /admin/faults`)."""

    @classmethod
    def from_settings(cls, s: RemoteStandInSettings) -> Faults:
        return cls(
            transient_error_rate=s.remote_transient_error_rate,
            latency_ms=s.remote_latency_ms,
            hang_rate=s.remote_hang_rate,
            hang_s=s.remote_hang_s,
            decline_rate=s.remote_decline_rate,
            outage=s.remote_outage,
            fail_operations=[op for op in s.remote_fail_operations.split(",") if op],
        )

    def update(self, changes: dict[str, Any]) -> None:
        known = {f.name: f.type for f in fields(self)}
        for name, value in changes.items():
            if name not in known:
                raise ValueError(f"unknown fault knob {name!r}; known: {sorted(known)}")
            if name == "outage":
                if not isinstance(value, bool):
                    raise ValueError("outage must be true or false")
            elif name.endswith("_operations"):
                if not isinstance(value, list) or not set(value) <= OPERATIONS:
                    raise ValueError(f"{name} must be a list of {sorted(OPERATIONS)}")
            elif (
                not isinstance(value, int | float)
                or value < 0
                or (name.endswith("rate") and value > 1)
            ):
                raise ValueError(f"{name} must be a number (a rate between 0 and 1)")
        for name, value in changes.items():
            setattr(self, name, value)


def declined(order_id: str, rate: float) -> bool:
    """Deterministic per order: the same orders are declined on every run and every retry."""
    digest = hashlib.sha256(f"decline:{order_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < rate


class RemoteService:
    def __init__(
        self,
        ledger: Ledger,
        faults: Faults,
        rng: random.Random,
        *,
        admin_token: str | None,
        accounts: Accounts,
    ) -> None:
        self.ledger = ledger
        self.faults = faults
        self.rng = rng
        self.admin_token = admin_token
        """The bearer token of `/admin/...` and `/ledger`; None: they refuse every request."""
        self.accounts = accounts
        """Who may call the operations, and the fence key of each (none: every call refused)."""
        self.calls: Counter[str] = Counter()
        """Calls answered, by status code: what a fault run or a breaker test counts."""

    def app(self) -> web.Application:
        app = web.Application(
            client_max_size=64 * 1024, middlewares=[admin_guard(self.admin_token)]
        )
        app.add_routes(
            [
                web.post("/{service}/{action}", self.call),
                web.get("/ledger", self.ledger_page),
                web.get("/attempts", self.attempts_page),
                web.get("/admin/faults", self.get_faults),
                web.put("/admin/faults", self.put_faults),
                web.get("/admin/stats", self.stats),
                web.get("/health", self.health),
            ]
        )
        return app

    async def health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "outage": self.faults.outage})

    async def stats(self, request: web.Request) -> web.Response:
        return web.json_response({"calls": dict(self.calls), "total": self.calls.total()})

    async def get_faults(self, request: web.Request) -> web.Response:
        return web.json_response(asdict(self.faults))

    async def put_faults(self, request: web.Request) -> web.Response:
        try:
            changes = await request.json()
            if not isinstance(changes, dict):
                raise ValueError("body must be a JSON object")
            self.faults.update(changes)
        except ValueError as exc:
            return web.json_response({"error": str(exc)}, status=400)
        log.info("fault knobs changed", extra={"faults": asdict(self.faults)})
        return web.json_response(asdict(self.faults))

    async def ledger_page(self, request: web.Request) -> web.Response:
        query = _page_query(request)
        if isinstance(query, web.Response):
            return query
        after, limit, account, order_id = query
        effects = (
            self.ledger.effects_of(account, order_id)
            if order_id
            else self.ledger.page(after=after, limit=limit, account=account)
        )
        return web.json_response({"effects": [e.to_json() for e in effects]})

    async def attempts_page(self, request: web.Request) -> web.Response:
        query = _page_query(request)
        if isinstance(query, web.Response):
            return query
        after, limit, account, order_id = query
        attempts = (
            self.ledger.attempts_of(account, order_id)
            if order_id
            else self.ledger.attempts_page(after=after, limit=limit, account=account)
        )
        return web.json_response({"attempts": [a.to_json() for a in attempts]})

    async def call(self, request: web.Request) -> web.Response:
        operation = f"{request.match_info['service']}.{request.match_info['action']}"
        account = request.headers.get(ACCOUNT_HEADER, "")
        if not ACCOUNT.fullmatch(account):
            status, payload = 400, {"error": f"{ACCOUNT_HEADER} must be a hub name"}
        elif not self.accounts.authenticates(account, request.headers.get("Authorization")):
            # Before the body is read: a caller without the account's key learns nothing.
            self.calls["401"] += 1
            log.warning("a call without its account's key refused", extra={"account": account})
            return web.json_response(UNAUTHENTICATED, status=401, headers=CHALLENGE)
        elif operation not in OPERATIONS:
            status, payload = 404, {"error": f"no operation {operation}"}
        else:
            try:
                body = RemoteCall.model_validate_json(await request.read())
            except ValidationError as exc:
                status, payload = 400, {"error": str(exc.errors()[:3])}
            else:
                answer, status = await self.answer(account, operation, body)
                return web.json_response(answer, status=status)
        self.calls[str(status)] += 1
        return web.json_response(payload, status=status)

    async def answer(
        self, account: str, operation: str, body: RemoteCall
    ) -> tuple[dict[str, Any], int]:
        """The answer to one call of a known operation, as (payload, HTTP status): what the
        service does, whichever way the call came (HTTP, or in process: harness/remote/local).
        A token whose signature does not check is refused before anything else: it is no
        attempt of the order's, so it is neither counted nor let near the fence."""
        if not self.accounts.fence_checks(
            account, body.order_id, body.fencing_token, body.fencing_signature
        ):
            self.calls["403"] += 1
            log.warning(
                "a fencing token whose signature does not check refused",
                extra={"account": account, "order_id": body.order_id, "operation": operation},
            )
            return forged(body.fencing_signature), 403
        # Counted as it arrives, before anything may delay it: an attempt is spent even if
        # this service dies, or the caller gives up, before it is answered.
        seq = self.ledger.attempt_arrived(
            account=account,
            order_id=body.order_id,
            operation=operation,
            idempotency_key=body.idempotency_key,
            fencing_token=body.fencing_token,
        )
        answer = Answered()
        try:
            payload, status = await self._respond(account, operation, body, answer)
        finally:
            self.ledger.attempt_answered(seq, answer.outcome, hung=answer.hung)
        self.calls[str(status)] += 1
        return payload, status

    async def _respond(
        self, account: str, operation: str, body: RemoteCall, answer: Answered
    ) -> tuple[dict[str, Any], int]:
        if self.faults.outage or operation in self.faults.fail_operations:
            answer.outcome = "outage"
            return {"error": "outage"}, 503
        if operation in self.faults.reject_operations:
            answer.outcome = "rejected"
            return {"outcome": "rejected", "error": "rejected"}, 400
        if self.faults.latency_ms:
            await asyncio.sleep(self.faults.latency_ms / 1000)
        if self.rng.random() < self.faults.transient_error_rate:
            answer.outcome = "transient"
            return {"error": "transient"}, 503
        try:
            if self.rng.random() < self.faults.hang_rate:
                self.ledger.observe_fence(account, body.order_id, body.fencing_token)
                answer.hung = True
                await asyncio.sleep(self.faults.hang_s)
            effect, made = self._apply(account, operation, body)
        except StaleFencingToken as exc:
            answer.outcome = "fenced"
            return {"outcome": "stale-fencing-token", "error": str(exc)}, 409
        except Undone as exc:
            answer.outcome = "undone"
            return {"outcome": "undone", "error": str(exc)}, 410
        answer.outcome = effect.outcome if made else "replayed"
        return _answer(effect, replayed=not made)

    def _apply(self, account: str, operation: str, body: RemoteCall) -> tuple[Effect, bool]:
        existing = self.ledger.find(account, body.idempotency_key)
        if existing is not None:
            return existing, False
        outcome, result = self._decide(account, operation, body)
        return self.ledger.record(
            account=account,
            idempotency_key=body.idempotency_key,
            operation=operation,
            order_id=body.order_id,
            fencing_token=body.fencing_token,
            outcome=outcome,
            result=result,
            undone_by=UNDONE_BY.get(operation, ()),
        )

    def _decide(self, account: str, operation: str, body: RemoteCall) -> tuple[str, dict[str, Any]]:
        if operation in UNDO_OF:
            done = [
                e
                for e in self.ledger.effects_of(account, body.order_id)
                if e.operation in UNDO_OF[operation] and e.outcome == "applied"
            ]
            if not done:
                return "noop", {"undid": None}
            return "applied", {"undid": done[0].seq}
        if operation in DECLINABLE and (
            declined(body.order_id, self.faults.decline_rate)
            or body.payload.get("payment_token") == DECLINED_TEST_TOKEN
        ):
            return "declined", {"reason": "card declined"}
        ref = hashlib.sha256(body.idempotency_key.encode()).hexdigest()[:12]
        kept = {k: v for k, v in body.payload.items() if k != "payment_token"}
        return "applied", {"ref": f"{operation.split('.')[1]}-{ref}", **kept}


@dataclass
class Answered:
    """What a call was answered, for its attempt's record (UNANSWERED until it is)."""

    outcome: str = UNANSWERED
    hung: bool = False


def _page_query(request: web.Request) -> tuple[int, int, str | None, str | None] | web.Response:
    """`after`, `limit`, `account` and `order_id` of a listing, or the 400 that refuses them."""
    try:
        after = int(request.query.get("after", "0"))
        limit = min(10_000, int(request.query.get("limit", "1000")))
    except ValueError:
        return web.json_response({"error": "after and limit must be integers"}, status=400)
    account = request.query.get("account")
    if account is not None and not ACCOUNT.fullmatch(account):
        return web.json_response({"error": "account must be a task hub name"}, status=400)
    return after, limit, account, request.query.get("order_id") or None


def _answer(effect: Effect, *, replayed: bool) -> tuple[dict[str, Any], int]:
    payload = {
        "outcome": effect.outcome,
        "result": effect.result,
        "seq": effect.seq,
        "replayed": replayed,
    }
    return payload, 422 if effect.outcome == "declined" else 200
