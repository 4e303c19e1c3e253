"""Who may use the remote stand-in's operator endpoints: `/admin/...` (the fault knobs, an outage
switch), `/ledger` (every effect, of every account) and `/attempts` (every call it was asked).

They answer only a request carrying `Authorization: Bearer <token>` with the token configured
as `ORDERFLOW_REMOTE_ADMIN_TOKEN` (in the compose deployment, the secret file
`/run/secrets/orderflow_remote_admin_token`, read through `ORDERFLOW_SECRETS_DIR`). With no token
configured they refuse every request (403): the switch is off, never open. The operations the
agents call (`POST /<service>/<action>`) and `GET /health` need no token.

The token is read here, beside the service that checks it, rather than in `shared.config`: only
the remote service and the operator's `orderflow audit` use it.
"""

from __future__ import annotations

import hmac
import os

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware
from pydantic import SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

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
    """The configured token (environment, or the secrets directory the deployment names)."""
    secrets = os.environ.get("ORDERFLOW_SECRETS_DIR") or None
    token = AdminSettings(_secrets_dir=secrets).remote_admin_token
    return token.get_secret_value() if token is not None else None


def is_guarded(path: str) -> bool:
    """The routes behind the token: every `/admin/...`, `/ledger` and `/attempts`."""
    return path in ("/ledger", "/attempts", "/admin") or path.startswith("/admin/")


def authorised(header: str | None, token: str) -> bool:
    """A constant-time comparison of `Authorization: Bearer <token>` with the token."""
    if header is None or not header.startswith(SCHEME):
        return False
    return hmac.compare_digest(header[len(SCHEME) :].encode(), token.encode())


def admin_guard(token: str | None) -> Middleware:
    """An aiohttp middleware refusing the guarded paths without the token."""

    @web.middleware
    async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
        # The route the request matched (routing runs first), not how its path was spelt.
        resource = request.match_info.route.resource
        if not is_guarded(resource.canonical if resource is not None else request.path):
            return await handler(request)
        if not token:
            return web.json_response(
                {"error": f"operator endpoints are off: {TOKEN_VARIABLE} is not set"}, status=403
            )
        if not authorised(request.headers.get("Authorization"), token):
            return web.json_response(
                {"error": "a bearer token is required"},
                status=401,
                headers={"WWW-Authenticate": 'Bearer realm="orderflow-remote"'},
            )
        return await handler(request)

    return guard
