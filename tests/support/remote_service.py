"""The remote stand-in in-process, over real HTTP on a free port, with its ledger in a file."""

from __future__ import annotations

import random
from pathlib import Path

from aiohttp import web

from services.remote.app import Faults, RemoteService
from services.remote.client import RemoteClient
from services.remote.ledger import Ledger
from tests.support.topology import free_port

ADMIN_TOKEN = "in-process-remote-admin-token"


class InProcessRemote:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.service: RemoteService
        self._runner: web.AppRunner | None = None

    async def start(self, **faults: object) -> None:
        self.service = RemoteService(
            Ledger(str(self.path)), Faults(**faults), random.Random(3), admin_token=ADMIN_TOKEN
        )
        self._runner = web.AppRunner(self.service.app())
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()

    async def stop(self) -> None:
        assert self._runner is not None
        await self._runner.cleanup()
        self.service.ledger.close()

    def client(self, *, account: str = "") -> RemoteClient:
        """A client calling as `account`, which may also read the ledger and the attempts."""
        return RemoteClient.open(self.url, account=account, admin_token=ADMIN_TOKEN)
