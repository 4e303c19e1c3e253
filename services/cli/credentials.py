"""`orderflow up`'s local development credentials: made on its first run, kept for the next.

A fresh clone has no operator token for the remote stand-in (which `orderflow audit` must
show to read the ledger) and no API token for the shop or the console. `up` makes what is
missing, writes it to `shared.config.CREDENTIALS_FILE` beside `.env` (mode 0600; never `.env`
itself, which is the user's), and reads it back on every later run. Every `orderflow` command
reads that file as it reads `.env` (`shared.config.env_files`): `.env` and the environment win
over it, so a token set there is used and none is made. The compose deployment never reads it:
its containers get their secrets as files.

The shop's and the console's logins are API tokens (shared/domain/tokens.py): the file keeps
their secrets, the hub's store their digests. `up` makes sure each secret is an active token
in the store of the hub it runs, so the same logins work after a change of hub or store.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Iterable
from dataclasses import dataclass

from dotenv import dotenv_values

from services.operator.tokens import keep_token
from shared.config import credentials_file
from shared.domain.timing import utcnow
from shared.domain.tokens import Role, digest_of, new_secret
from shared.errors import ConfigurationError
from shared.remote.admin import TOKEN_VARIABLE, admin_token
from shared.store.port import ApiTokens

SHOP_TOKEN = "ORDERFLOW_LOCAL_SHOP_TOKEN"
OPERATOR_TOKEN = "ORDERFLOW_LOCAL_OPERATOR_TOKEN"


@dataclass(frozen=True)
class Login:
    """A login `up` keeps: its line in the file, its token's name and role."""

    variable: str
    name: str
    role: Role


LOGINS = (
    Login(SHOP_TOKEN, "local-shop", Role.SHOP),
    Login(OPERATOR_TOKEN, "local-operator", Role.OPERATOR),
)

HEADER = """\
# Local development credentials, made by `orderflow up` on its first run here and reused
# after. Keep this file private (mode 0600); delete it to have `orderflow up` make new ones.
# Every `orderflow` command run here reads it like .env (.env and the environment win).
# Docker compose never reads it.
"""


def read_credentials(path: str) -> dict[str, str]:
    """The file's values (none when there is no file), its mode made 0600 if it was wider."""
    if not os.path.isfile(path):
        return {}
    if os.stat(path).st_mode & 0o077:
        os.chmod(path, 0o600)
    return {k: v for k, v in dotenv_values(path).items() if v}


def write_credentials(path: str, values: dict[str, str]) -> None:
    """Replace the file with `values`, readable by its owner only from its first byte."""
    partial = f"{path}.partial"
    try:
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.fchmod(fd, 0o600)  # a partial file left by a crash keeps its mode through O_TRUNC
        with os.fdopen(fd, "w") as out:
            out.write(HEADER + "".join(f"{k}={v}\n" for k, v in values.items()))
        os.replace(partial, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(partial)
        raise ConfigurationError(
            f"cannot write the local credentials to {path!r} ({exc.strerror or exc}): set "
            f"{TOKEN_VARIABLE} in the environment, or run `orderflow up` where it may write"
        ) from None


def local_credentials(*, remote: bool, api: bool) -> dict[str, str]:
    """What `up` runs with: the stand-in's operator token (with `remote`, unless one is set
    elsewhere) and the logins (with `api`), each read from the file or made and written to it."""
    path = credentials_file()
    kept = read_credentials(path)
    values = dict(kept)
    wanted: list[str] = [login.variable for login in LOGINS] if api else []
    token = admin_token() if remote else None  # the environment's, .env's or the file's
    if remote and token is None:
        values.setdefault(TOKEN_VARIABLE, secrets.token_urlsafe(32))
    for variable in wanted:
        values.setdefault(variable, new_secret())
    if values != kept:
        write_credentials(path, values)
    if token is not None:
        values[TOKEN_VARIABLE] = token
    return values


async def keep_logins(tokens: ApiTokens, values: dict[str, str]) -> list[Login]:
    """Make each login of `values` an active token of the store; the logins that could not be
    (another active token holds the name)."""
    now = utcnow()
    refused = []
    for login in logins_in(values):
        if await keep_token(tokens, login.name, login.role, values[login.variable], now=now):
            continue
        if digest_of(values[login.variable]) in await revoked_digests(tokens):
            # Revoked by an operator (it leaked, say): burnt for good, in every store. A new
            # one replaces it, in the file and in `values`, which `up` then prints.
            values[login.variable] = new_secret()
            kept = read_credentials(credentials_file())
            write_credentials(credentials_file(), kept | {login.variable: values[login.variable]})
            if await keep_token(tokens, login.name, login.role, values[login.variable], now=now):
                continue
        refused.append(login)
    return refused


async def revoked_digests(tokens: ApiTokens) -> set[str]:
    return {t.digest for t in await tokens.token_list() if t.revoked_at is not None}


def logins_in(values: dict[str, str]) -> Iterable[Login]:
    return (login for login in LOGINS if login.variable in values)
