"""API tokens as the operator manages them (`orderflow tokens create|revoke|list`).

A token's secret exists once, in what `create_token` returns: the store keeps its digest
(shared/domain/tokens.py), so a lost secret is replaced by revoking its token and making a new
one, which may take the same name. Each function takes the `ApiTokens` part of the store; the
commands run them on the store of their operations (services/cli/operations.py).
"""

from __future__ import annotations

from datetime import datetime
from typing import TypeVar

from shared.domain.tokens import ApiToken, Role, digest_of, issue, valid_name
from shared.errors import BadInput
from shared.store.port import ApiTokens

T = TypeVar("T")


def checked_name(name: str, role: Role | None = None) -> str:
    """`name` if it can name a token (of `role`), else `BadInput` saying what a name may be."""
    try:
        return valid_name(name, role)
    except ValueError as exc:
        raise BadInput(str(exc)) from None


async def create_token(
    tokens: ApiTokens, name: str, role: Role, *, now: datetime
) -> tuple[ApiToken, str]:
    """A new token of `role` named `name`, and its secret (to hand over once, keep nowhere);
    `BadInput` when the name is invalid or an active token has it."""
    token, secret = issue(checked_name(name, role), role, now=now)
    if not await tokens.token_create(token):
        raise BadInput(
            f"an active token is named {name!r} already: revoke it first "
            f"(`orderflow tokens revoke {name}`) or choose another name"
        )
    return token, secret


async def keep_token(
    tokens: ApiTokens, name: str, role: Role, secret: str, *, now: datetime
) -> bool:
    """Make `secret` an active token of `role` named `name`, unless it is one already (a login
    `orderflow up` keeps across its runs, and across hubs, in its credentials file): True when
    it is one now; False when another active token has the name, the secret has another role,
    or it was revoked (nothing is written then)."""
    found = await tokens.token_find(digest_of(secret))
    if found is not None:
        return found.role is role
    made, _ = issue(checked_name(name, role), role, now=now, secret=secret)
    return await tokens.token_create(made)


async def revoke_token(tokens: ApiTokens, name: str, *, now: datetime) -> None:
    """Revoke the active token named `name` (refused from the next request on); `BadInput`
    when no active token has that name."""
    if not await tokens.token_revoke(name, at=now):
        raise BadInput(f"no active token is named {name!r} (`orderflow tokens list` shows them)")


async def list_tokens(tokens: ApiTokens) -> list[ApiToken]:
    """Every token, active and revoked, newest first."""
    return await tokens.token_list()
