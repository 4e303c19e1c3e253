"""Serving the remote stand-in: `orderflow serve remote` (and `orderflow up`) run it on the host
and port of its settings, with its ledger, fault knobs, operator token and accounts."""

from __future__ import annotations

import asyncio
import logging
import random
from urllib.parse import urlsplit

from aiohttp import web

from harness.remote.accounts import remote_accounts
from harness.remote.app import Faults, RemoteService
from harness.remote.ledger import Ledger
from shared.config import Settings
from shared.errors import ConfigurationError
from shared.masking import mask_credentials
from shared.metrics import serve_metrics
from shared.remote.admin import admin_token

log = logging.getLogger(__name__)


def remote_port(settings: Settings) -> int:
    """The port the remote stand-in listens on: `ORDERFLOW_REMOTE_PORT`, else its URL's."""
    url = urlsplit(settings.remote.remote_url)
    default = 443 if url.scheme == "https" else 80
    return settings.stand_in.remote_port or url.port or default


async def serve_remote(settings: Settings, stop: asyncio.Event) -> None:
    """Run the remote service on the host of `ORDERFLOW_REMOTE_URL` and its port (or
    `ORDERFLOW_REMOTE_PORT`) until `stop`; a port in use is a one-line `ConfigurationError`."""
    url = urlsplit(settings.remote.remote_url)
    host, port = url.hostname or "127.0.0.1", remote_port(settings)
    ledger = Ledger(settings.stand_in.remote_ledger_path)
    service = RemoteService(
        ledger,
        Faults.from_settings(settings.stand_in),
        random.Random(settings.stand_in.remote_seed),
        admin_token=admin_token(),
        accounts=remote_accounts(),
    )
    runner = web.AppRunner(service.app(), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    try:
        await site.start()
    except OSError as exc:
        await runner.cleanup()
        ledger.close()
        raise ConfigurationError(
            f"the remote service cannot listen on {host}:{port} ({exc.strerror or exc}): "
            "set ORDERFLOW_REMOTE_PORT to a free port"
        ) from None
    log.info(
        "remote service listening",
        extra={
            "url": mask_credentials(f"{url.scheme or 'http'}://{host}:{port}"),
            "operator_endpoints": bool(service.admin_token),
            "accounts": len(service.accounts),
        },
    )
    try:
        # Only the process's own metrics (the calls are in the ledger and `GET /admin/faults`).
        metrics = await serve_metrics(
            settings.observability.metrics_port, settings.observability.metrics_host
        )
        try:
            await stop.wait()
        finally:
            if metrics is not None:
                await metrics.close()
    finally:
        await runner.cleanup()
        ledger.close()
