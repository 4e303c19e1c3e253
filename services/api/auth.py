"""Who is asking: an API token (`Authorization: Bearer <token>`) and the role it was made with.

Tokens are made by `orderflow tokens create` and kept hashed (shared/domain/tokens.py); each
request looks its token up by digest, so a revoked token is refused from the next request on.
No token, or one the store does not know, is a 401; a token of the wrong role is a 403; neither
has any side effect (the check runs before the endpoint's body is read).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, HTTPException, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from services.api.context import ApiContext
from shared.domain.tokens import Role, digest_of

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
    token = await context(request).store.token_find(digest_of(credentials.credentials))
    if token is None:
        raise HTTPException(401, "unknown or revoked API token", headers=CHALLENGE)
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
