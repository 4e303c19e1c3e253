"""API tokens: who may call the HTTP API, in which role, kept hashed at rest (DESIGN §3).

A token is a random secret handed to its holder once (`orderflow tokens create`); the store
keeps only its SHA-256 digest, its name and its role. A request's token is looked up by its
digest, so a copy of the store lets nobody in, and a revoked token is refused from the next
request on. Pure: no I/O here.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from datetime import UTC, datetime
from enum import StrEnum
from typing import Annotated

from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    ConfigDict,
    StringConstraints,
    ValidationInfo,
)

from shared.domain.text import is_stored

TOKEN_SCHEMA_VERSION = 1
"""Version of the API token record layout written by this build."""

SECRET_PREFIX = "oft_"
"""What every secret starts with: a token found in a log or a paste is recognisably ours."""
SECRET_BYTES = 32
"""256 random bits (before the URL-safe base64 encoding)."""

NAME_LIMIT = 64
_NAME = re.compile(rf"[A-Za-z0-9._-]{{1,{NAME_LIMIT}}}")
SHOP_NAME_LIMIT = 23
_SHOP_NAME = re.compile(rf"[a-z0-9][a-z0-9_-]{{0,{SHOP_NAME_LIMIT - 1}}}")
"""A shop's token name also prefixes the ids of the orders it places (`<shop>.<its id>`, at
most 64 characters with an id of up to 40: services/api/models.py), so it is shorter and has
no '.': no shop's prefix can be read as another's."""


class Role(StrEnum):
    """What a token's holder may do through the API."""

    SHOP = "shop"
    """A shop (an application): submits its own orders, reads, follows and cancels them."""
    VIEWER = "viewer"
    """Reads what an operator reads; changes nothing."""
    OPERATOR = "operator"
    """A viewer who may also act on orders and dead letters (each action recorded with the
    token's name as who asked)."""


def new_secret() -> str:
    """A fresh token secret: `oft_` and 256 random bits, URL-safe (43 characters)."""
    return SECRET_PREFIX + secrets.token_urlsafe(SECRET_BYTES)


def digest_of(secret: str) -> str:
    """What the store keeps of a secret, and looks it up by: its SHA-256, in hex.

    One fast hash, no salt and no slow key derivation, on purpose: a secret is 256 random bits,
    not a password a person chose, so there is no dictionary to try and guessing one from its
    digest is as hopeless as guessing it outright. A salt would also forbid finding a token by
    its digest (one indexed lookup per request)."""
    return hashlib.sha256(secret.encode("utf-8", "surrogatepass")).hexdigest()


def valid_name(name: str, role: Role | None = None) -> str:
    """`name` if it can name a token (of `role`), else ValueError saying what a name may be."""
    if not _NAME.fullmatch(name):
        raise ValueError(
            f"a token name is 1 to {NAME_LIMIT} letters, digits, '.', '_' or '-' (got {name!r})"
        )
    if role is Role.SHOP and not _SHOP_NAME.fullmatch(name):
        raise ValueError(
            f"a shop's token name is 1 to {SHOP_NAME_LIMIT} lower-case letters, digits, '_' or "
            f"'-', starting with a letter or digit: it prefixes the shop's order ids (got {name!r})"
        )
    return name


def _name(value: str, info: ValidationInfo) -> str:
    # A stored name was accepted when it was written, under the rules of its day.
    return value if is_stored(info) else valid_name(value)


def _in_utc(value: datetime) -> datetime:
    return value.astimezone(UTC)


TokenName = Annotated[str, AfterValidator(_name)]
Digest = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]
UtcTime = Annotated[AwareDatetime, AfterValidator(_in_utc)]


class ApiToken(BaseModel):
    """One API token as the store keeps it: never its secret, only the secret's digest.

    A name belongs to at most one active (not revoked) token at a time; once that one is
    revoked the name may be given to a new token, and the revoked one stays listed."""

    model_config = ConfigDict(strict=True, frozen=True, extra="forbid")

    name: TokenName
    """Who holds it, as the order history records who acted (`by`)."""
    role: Role
    digest: Digest
    """`digest_of(secret)`."""
    created_at: UtcTime
    revoked_at: UtcTime | None = None
    schema_version: int = TOKEN_SCHEMA_VERSION

    @property
    def active(self) -> bool:
        return self.revoked_at is None


def issue(
    name: str, role: Role, *, now: datetime, secret: str | None = None
) -> tuple[ApiToken, str]:
    """A new token named `name` and its secret (shown to its holder once, kept nowhere): a new
    one, or `secret` where its holder keeps one already (`orderflow up`'s local logins)."""
    valid_name(name, role)
    secret = secret or new_secret()
    return ApiToken(name=name, role=role, digest=digest_of(secret), created_at=now), secret
