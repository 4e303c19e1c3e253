"""The API as a FastAPI application, and `orderflow serve api`: the app served by uvicorn inside
the process's own event loop, beside its status queue and its heartbeat.

FastAPI, rather than the aiohttp the other processes serve metrics with, because it generates
the OpenAPI document (`/openapi.json`) from the very models that validate each request and
answer it, so the document cannot drift from the code; schemathesis checks the served document
against the running API.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from services.api import operations, pages, shop
from services.api.auth import body_allowance
from services.api.context import ApiContext, StatusBridge, load_catalogue
from services.api.limits import BodyLimit, h11_with_read_timeout
from services.api.models import ErrorBody, ShownJSON, refused_input
from services.operator.operations import Operations
from shared.bootstrap import Runtime
from shared.broker.private import PrivateQueue
from shared.broker.publisher import Publisher
from shared.broker.rabbitmq import connect
from shared.broker.senders import APP, Senders
from shared.broker.urls import login_user
from shared.domain.text import shown_cut
from shared.errors import BadInput, ConfigurationError, NotFound, ServiceUnavailable

log = logging.getLogger(__name__)

DESCRIPTION = """\
orderflow's HTTP API: shops place, follow and cancel orders; operators find, inspect and act on
them. Every endpoint but the pages takes an API token (`Authorization: Bearer <token>`, made by
`orderflow tokens create --role shop|viewer|operator`). A refusal is a 4xx with a `detail`
saying why; nothing is changed by a refused request.
"""


LIMITED: dict[int | str, dict[str, Any]] = {
    408: {"model": ErrorBody, "description": "The body did not arrive in time."},
    413: {"model": ErrorBody, "description": "The body is larger than this endpoint takes."},
    429: {
        "model": ErrorBody,
        "description": "Too many unknown tokens from this address (a stream: this token "
        "follows its most orders already); `Retry-After` says when to try again.",
    },
}
"""What any request may be answered by the API's limits (services/api/limits.py)."""


def create_app(ctx: ApiContext | None) -> FastAPI:
    """The application; without a context, only to read its OpenAPI document (`openapi`)."""
    app = FastAPI(
        title="orderflow",
        version="1",
        description=DESCRIPTION,
        # No page of the API renders its document: Swagger UI and ReDoc are third-party code
        # from a CDN, and the lock holds no copy to serve (the document is at /openapi.json).
        docs_url=None,
        redoc_url=None,
        responses=LIMITED,
    )
    if ctx is not None:
        app.state.context = ctx
        app.add_middleware(BodyLimit, allowance=body_allowance(ctx))
    app.include_router(shop.router)
    app.include_router(operations.router)
    app.include_router(pages.router)

    @app.exception_handler(ServiceUnavailable)
    async def unavailable(request: Request, exc: ServiceUnavailable) -> JSONResponse:
        log.warning("a server is unavailable", extra={"error": shown_cut(str(exc), 300)})
        return ShownJSON(
            {"detail": shown_cut(f"a server orderflow needs is unavailable: {exc}", 500)},
            status_code=503,
            headers={"Retry-After": "5"},
        )

    @app.exception_handler(NotFound)
    async def not_found(request: Request, exc: NotFound) -> JSONResponse:
        return ShownJSON({"detail": str(exc)}, status_code=404)

    @app.exception_handler(BadInput)
    async def bad_input(request: Request, exc: BadInput) -> JSONResponse:
        return ShownJSON({"detail": str(exc)}, status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def refused(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return ShownJSON(
            {"detail": str(exc.detail)}, status_code=exc.status_code, headers=exc.headers
        )

    app.add_exception_handler(RequestValidationError, refused_input)
    return app


def openapi_document() -> str:
    """The API's OpenAPI document, as committed in docs/openapi.json (`orderflow deploy write`
    regenerates it, and a unit test fails while the committed one differs): a change of the
    API shows in review as a change of its contract."""
    return json.dumps(create_app(None).openapi(), indent=2, sort_keys=True) + "\n"


OPERATOR_URL_REFUSED = (
    "ORDERFLOW_API_OPERATOR_RABBITMQ_URL is set, and no longer read: the API has a broker user "
    "of its own, `<hub>-api`, which may not take the alert feed as the operator's may. Load the "
    "generated RabbitMQ definitions (they add it), set ORDERFLOW_API_RABBITMQ_URL to its URL "
    "(compose: `sh infra/secrets.sh` writes secrets/rabbitmq_api_url) and remove the old setting"
)
"""Why the API refuses to start with the setting that gave it the operator's broker user."""


def api_app(settings: Any) -> str:
    """The API's application name: its broker user, which prefixes its status queue."""
    return login_user(settings.broker.rabbitmq_url) or ""


async def serve_api(runtime: Runtime, stop: asyncio.Event) -> None:
    """Serve the API on `api_host:api_port` until `stop`."""
    settings = runtime.settings
    if settings.api.api_operator_rabbitmq_url:
        raise ConfigurationError(OPERATOR_URL_REFUSED)
    app_name = api_app(settings)
    try:
        status_queue = runtime.names.status_queue(app_name)
    except ValueError as exc:
        raise ConfigurationError(
            f"the API's broker user {app_name!r} cannot name a status queue: {exc}"
        ) from None
    bridge = StatusBridge(
        Senders.of(settings.hub, settings.broker.broker_user_prefix, app_name or None, APP)
    )
    statuses = PrivateQueue(
        runtime.connection,
        status_queue,
        bridge.on_status,
        max_bytes=settings.broker.max_message_bytes,
    )
    await statuses.start()
    operator, tells = runtime.connection, runtime.publisher
    if settings.api.api_rabbitmq_url:
        operator = await connect(
            settings.api.api_rabbitmq_url,
            timeout=settings.process.connect_timeout_s,
            name=f"{runtime.name}-operator",
        )
        # The statuses the API sends itself (a cancellation's) go as its own user, the one
        # allowed onto the status exchange and trusted by the applications for them.
        tells = await Publisher.open(operator, timeout=settings.broker.publish_timeout_s)
    ctx = ApiContext(
        settings=settings.api,
        max_message_bytes=settings.broker.max_message_bytes,
        store=runtime.store,
        connection=runtime.connection,
        publisher=runtime.publisher,
        names=runtime.names,
        app=app_name,
        status_queue=status_queue,
        bridge=bridge,
        catalogue=load_catalogue(settings.api),
        ops=Operations(
            settings,
            runtime.names,
            # A replay's sender: the API's own broker user.
            Senders.of(
                settings.hub,
                settings.broker.broker_user_prefix,
                login_user(settings.api.api_rabbitmq_url or settings.broker.rabbitmq_url),
                "api",
            ),
            runtime.store,
            operator,
            tells,
        ),
    )
    config = uvicorn.Config(
        create_app(ctx),
        host=settings.api.api_host,
        port=settings.api.api_port,
        log_config=None,  # the process's own JSON logging
        access_log=False,
        lifespan="off",
        timeout_graceful_shutdown=5,
        # Longer than a proxy's or a browser's idle connection (60 s is the usual), so the
        # server never closes one just as its client sends a request on it (uvicorn's 5 s did,
        # under a client pausing a few seconds: a POST the client could not safely send again).
        # It starts only once a response is sent: a connection that never sends a whole head
        # is closed by the read timeout instead.
        timeout_keep_alive=75,
        http=h11_with_read_timeout(settings.api.api_read_timeout_s),
        limit_concurrency=settings.api.api_max_connections,
    )
    server = uvicorn.Server(config)

    def status() -> dict[str, Any]:
        return {"port": settings.api.api_port, "streams": ctx.streams.count, "jobs": len(ctx.jobs)}

    async with runtime.heartbeat("api", status):
        serving = asyncio.create_task(server.serve())
        stopping = asyncio.create_task(stop.wait())
        try:
            done, _ = await asyncio.wait({serving, stopping}, return_when=asyncio.FIRST_COMPLETED)
            if serving in done and not server.started:
                serving.result()  # raise what stopped it
                raise ConfigurationError(
                    f"the API could not listen on {settings.api.api_host}:{settings.api.api_port}"
                )
            log.info("api stopping")
        finally:
            server.should_exit = True
            await serving
            stopping.cancel()
            await statuses.stop()
            if operator is not runtime.connection:
                await tells.close()
                await operator.close()
