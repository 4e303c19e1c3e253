"""Who may call the remote stand-in's operations: its accounts, each with two keys.

An account is a calling deployment's task hub (`X-Orderflow-Account`, shared/remote/client.py).
Its **key** authenticates the caller: every `POST /<service>/<action>` carries
`Authorization: Bearer <key>`, compared in constant time; no key, an unknown account, or
another account's key is a 401 before the body is read. Its **fence key** checks the fencing
token a call carries (shared/remote/fencing.py): the agents hold the key, the schedulers the
fence key, the remote both.

The accounts are `ORDERFLOW_REMOTE_ACCOUNTS`: comma-separated `<account>:<key>:<fence key>`
entries (in the compose deployment, the secret file `/run/secrets/orderflow_remote_accounts`,
read through `ORDERFLOW_SECRETS_DIR`, which `infra/secrets.sh` writes from the secrets
`remote_account_key` and `remote_fence_key`). Without any, every call is refused: the service
is closed, never open. Read here, beside the service that checks them, like its operator token
(harness/remote/admin.py): only the remote service holds this table.
"""

from __future__ import annotations

import hmac
import os
import re
from dataclasses import dataclass

from pydantic import SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from shared.config import Settings
from shared.domain.identity import parse_instance_id
from shared.errors import ConfigurationError
from shared.remote.fencing import signature_checks

ACCOUNTS_VARIABLE = "ORDERFLOW_REMOTE_ACCOUNTS"
SCHEME = "Bearer "
ACCOUNT = re.compile(r"[a-z][a-z0-9_]{0,39}|")
"""An account's name: a task hub's (or empty: the unnamed account)."""
KEY = re.compile(r"[A-Za-z0-9._~-]{16,200}")
"""A key: at least 16 URL-safe characters (`infra/secrets.sh` writes 64 hex digits)."""


UNAUTHENTICATED = {"error": "the account's key is required (Authorization: Bearer <key>)"}
"""The answer (401) to a call without its account's key."""
CHALLENGE = {"WWW-Authenticate": 'Bearer realm="orderflow-remote"'}
FORGED = "forged-fencing-token"
"""The outcome (403) of a call whose fencing token's signature does not check."""


def forged(signature: str | None) -> dict[str, str]:
    """The answer (403) to a call whose fencing token carries `signature`, which does not check."""
    why = "is not signed" if signature is None else "has a signature that does not check"
    return {
        "outcome": FORGED,
        "error": f"the fencing token {why}: only the scheduler holding the attempt can sign it "
        "(ORDERFLOW_REMOTE_FENCE_KEY, the same as the account's fence key here)",
    }


class AccountSettings(BaseSettings):
    """The one setting of the remote's accounts (read like every orderflow setting)."""

    model_config = SettingsConfigDict(
        env_prefix="ORDERFLOW_", extra="ignore", frozen=True, env_ignore_empty=True
    )

    remote_accounts: SecretStr | None = None
    """`<account>:<key>:<fence key>`, comma-separated; unset: every call is refused."""


@dataclass(frozen=True)
class Account:
    key: bytes
    fence_key: bytes


class Accounts:
    """The accounts a remote service knows, and the two checks it makes with them."""

    def __init__(self, accounts: dict[str, Account] | None = None) -> None:
        self._accounts = dict(accounts or {})

    @classmethod
    def parse(cls, text: str) -> Accounts:
        """The table of `ORDERFLOW_REMOTE_ACCOUNTS`; a `ConfigurationError` that shows no key."""
        accounts: dict[str, Account] = {}
        for number, entry in enumerate(text.split(","), 1):
            name, key, fence_key = _entry(entry.strip(), number)
            if name in accounts:
                raise ConfigurationError(f"{ACCOUNTS_VARIABLE}: account {name!r} is named twice")
            accounts[name] = Account(key.encode(), fence_key.encode())
        return cls(accounts)

    def __len__(self) -> int:
        return len(self._accounts)

    def authenticates(self, account: str, authorization: str | None) -> bool:
        """Whether `Authorization: Bearer <key>` carries the key of `account`."""
        known = self._accounts.get(account)
        if known is None or authorization is None or not authorization.startswith(SCHEME):
            return False
        given = authorization[len(SCHEME) :].encode("utf-8", "surrogateescape")
        return hmac.compare_digest(given, known.key)

    def fence_checks(
        self, account: str, order_id: str, fencing_token: str, signature: object
    ) -> bool:
        """Whether `fencing_token` is an attempt of `order_id` (`<order_id>:<attempt>.<nonce>`,
        or `<order_id>:<attempt>` from before nonces) and `signature` is the one the account's
        schedulers give it. The token names its order: a real signed token of another order,
        sent with this one's id, would move this order's fence to that attempt."""
        known = self._accounts.get(account)
        return (
            known is not None
            and _order_of(fencing_token) == order_id
            and signature_checks(known.fence_key, account, fencing_token, signature)
        )


def _order_of(fencing_token: str) -> str | None:
    try:
        return parse_instance_id(fencing_token)[0]
    except ValueError:
        return None


def _entry(entry: str, number: int) -> tuple[str, str, str]:
    parts = entry.split(":")
    where = f"{ACCOUNTS_VARIABLE}, entry {number}"
    if len(parts) != 3:
        raise ConfigurationError(f"{where}: not <account>:<key>:<fence key>")
    name, key, fence_key = parts
    if not ACCOUNT.fullmatch(name):
        raise ConfigurationError(f"{where}: the account must be a task hub's name")
    if not KEY.fullmatch(key) or not KEY.fullmatch(fence_key):
        raise ConfigurationError(f"{where}: each key must be {KEY.pattern}")
    if key == fence_key:
        # An agent holds the key: with the fence key too it could sign any token.
        raise ConfigurationError(f"{where}: the key and the fence key must differ")
    return name, key, fence_key


def hub_account(settings: Settings) -> Accounts:
    """The one account of a hub whose settings hold both its keys (a remote service in the
    same process as the hub's schedulers and agents: the simulation's, a test's)."""
    key, fence_key = settings.remote.remote_account_key, settings.remote.remote_fence_key
    if key is None or fence_key is None:
        raise ConfigurationError("the hub's account needs both its key and its fence key")
    return Accounts.parse(f"{settings.hub}:{key.get_secret_value()}:{fence_key.get_secret_value()}")


def remote_accounts() -> Accounts:
    """The configured accounts (environment, or the secrets directory the deployment names)."""
    secrets = os.environ.get("ORDERFLOW_SECRETS_DIR") or None
    configured = AccountSettings(_secrets_dir=secrets).remote_accounts
    if configured is None or not configured.get_secret_value().strip():
        return Accounts()
    return Accounts.parse(configured.get_secret_value().strip())
