"""Who is asking: an API token (`Authorization: Bearer <token>`) and the role it was made with.

Tokens are made by `orderflow tokens create` and kept hashed (shared/domain/tokens.py); each
request looks its token up by digest, so a revoked token is refused from the next request on.
No token, or one the store does not know, is a 401; a token of the wrong role is a 403; neither
has any side effect. Past 20 unknown tokens in a minute from one client address, that address is
answered 429 (with `Retry-After`) without a lookup, unless its token authenticated lately
(services/api/limits.py `FailedAuth`): guessing is slowed, and nobody else is locked out.

FastAPI reads a request's body before it checks the token, so the body is bounded before that
(`BodyLimit`): what a client may send is `max_message_bytes` (an order must fit in a message
anyway), except an operator's bulk requests, which may send back a long dry run's selection.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, HTTPException, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.datastructures import Headers
from starlette.types import Scope

from services.api.context import ApiContext
from services.api.limits import BULK_BODY_BYTES, BULK_BODY_S, Allowance
from shared.domain.tokens import Role, digest_of
from shared.errors import ServiceUnavailable

bearer = HTTPBearer(
    auto_error=False,
    scheme_name="token",
    description="An API token (`orderflow tokens create --role shop|viewer|operator`).",
)

CHALLENGE = {"WWW-Authenticate": 'Bearer realm="orderflow"'}


@dataclass(frozen=True)
class Identity:
    """The holder of a token: its name is what the history records as `by`."""

    name: str
    role: Role


def context(request: Request) -> ApiContext:
    found: ApiContext = request.app.state.context
    return found


async def identity(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
) -> Identity:
    if credentials is None or not credentials.credentials:
        raise HTTPException(
            401, "no API token: send `Authorization: Bearer <token>`", headers=CHALLENGE
        )
    ctx, digest = context(request), digest_of(credentials.credentials)
    address = request.client.host if request.client is not None else ""
    wait = ctx.failed_auth.refusal(address, digest)
    if wait is not None:
        raise HTTPException(
            429,
            f"too many unknown or revoked API tokens from {address}: try again in {wait} s",
            headers={"Retry-After": str(wait)},
        )
    token = await ctx.store.token_find(digest)
    if token is None:
        ctx.failed_auth.failed(address)
        raise HTTPException(401, "unknown or revoked API token", headers=CHALLENGE)
    ctx.failed_auth.succeeded(digest)
    return Identity(token.name, token.role)


def role(*roles: Role) -> Callable[..., Awaitable[Identity]]:
    """A dependency: the caller, who must hold a token of one of `roles`."""
    allowed = ", ".join(r.value for r in roles)

    async def check(who: Annotated[Identity, Depends(identity)]) -> Identity:
        if who.role not in roles:
            raise HTTPException(
                403, f"this needs a token of role {allowed}; {who.name}'s is {who.role.value}"
            )
        return who

    return check


Shop = Annotated[Identity, Depends(role(Role.SHOP))]
Viewer = Annotated[Identity, Depends(role(Role.VIEWER, Role.OPERATOR))]
Operator = Annotated[Identity, Depends(role(Role.OPERATOR))]
Anyone = Annotated[Identity, Depends(identity)]


BULK_BODIES = {("POST", "/ops/resubmit"), ("POST", "/ops/dead-letters/replay")}
"""The operator's requests whose bodies may be larger than a message: a bulk resubmission
sending back what its dry run selected, a replay naming the dead letters."""


def body_allowance(ctx: ApiContext) -> Callable[[Scope], Awaitable[Allowance]]:
    """What a request's body may be (services/api/limits.py `BodyLimit`): `max_message_bytes`
    within `api_read_timeout_s`, or the bulk allowance for an operator's token on `BULK_BODIES`
    (looked up only there, and not for an address refused for unknown tokens)."""
    ordinary = Allowance(ctx.max_message_bytes, ctx.settings.api_read_timeout_s)
    bulk = Allowance(BULK_BODY_BYTES, BULK_BODY_S)

    async def allowance(scope: Scope) -> Allowance:
        if (scope["method"], scope["path"]) not in BULK_BODIES:
            return ordinary
        scheme, _, secret = Headers(scope=scope).get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not secret.strip():
            return ordinary
        digest, client = digest_of(secret.strip()), scope.get("client")
        if ctx.failed_auth.refusal(client[0] if client else "", digest) is not None:
            return ordinary
        try:
            token = await ctx.store.token_find(digest)
        except ServiceUnavailable:
            # The ordinary allowance; the endpoint's own look-up answers 503, as every
            # endpoint does in an outage (this runs outside FastAPI's handlers: a 500 here).
            return ordinary
        return bulk if token is not None and token.role is Role.OPERATOR else ordinary

    return allowance
