"""The operator token of the remote service's operator endpoints (`/admin/...`, `/ledger`,
`/attempts`): the remote service checks it, and the operator's `orderflow audit` presents it
to read the ledger.

It is `ORDERFLOW_REMOTE_ADMIN_TOKEN` (in the compose deployment, the secret file
`/run/secrets/orderflow_remote_admin_token`, read through `ORDERFLOW_SECRETS_DIR`), read here
rather than in `shared.config`: only the remote service and the audit use it. It is read from
the same files as every setting (`.env`, and the credentials `orderflow up` made for its
stand-in: `shared.config.env_files`), the environment winning.
"""

from __future__ import annotations

import os

from pydantic import SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from shared.config import env_files

TOKEN_VARIABLE = "ORDERFLOW_REMOTE_ADMIN_TOKEN"
SCHEME = "Bearer "


class AdminSettings(BaseSettings):
    """The one setting of the operator endpoints (read like every orderflow setting)."""

    model_config = SettingsConfigDict(
        env_prefix="ORDERFLOW_",
        extra="ignore",
        frozen=True,
        env_ignore_empty=True,
    )

    remote_admin_token: SecretStr | None = None
    """Bearer token of the remote stand-in's `/admin/...` and `/ledger`; unset: they refuse."""


def admin_token() -> str | None:
    """The configured token (environment, the settings' files, or the secrets directory the
    deployment names)."""
    secrets = os.environ.get("ORDERFLOW_SECRETS_DIR") or None
    token = AdminSettings(_env_file=env_files(), _secrets_dir=secrets).remote_admin_token
    return token.get_secret_value() if token is not None else None
