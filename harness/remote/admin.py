"""Who may use the remote stand-in's operator endpoints: `/admin/...` (the fault knobs, an outage
switch), `/ledger` (every effect, of every account) and `/attempts` (every call it was asked).

They answer only a request carrying `Authorization: Bearer <token>` with the token configured
as `ORDERFLOW_REMOTE_ADMIN_TOKEN` (in the compose deployment, the secret file
`/run/secrets/orderflow_remote_admin_token`, read through `ORDERFLOW_SECRETS_DIR`). With no token
configured they refuse every request (403): the switch is off, never open. The operations the
agents call (`POST /<service>/<action>`) and `GET /health` need no token.

The token itself is configured and read in shared/remote/admin.py, which the operator's
`orderflow audit` shares.
"""

from __future__ import annotations

import hmac

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from shared.remote.admin import SCHEME, TOKEN_VARIABLE


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
