"""The remote stand-in in-process, over real HTTP on a free port, with its ledger in a file;
and the tests' accounts at it: each account's key and fence key, fixed by its name, and a
client that calls as one of them (its key sent, each token signed as its schedulers would)."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from aiohttp import web

from harness.remote.accounts import Accounts
from harness.remote.app import Faults, RemoteService
from harness.remote.ledger import Ledger
from shared.remote.client import RemoteClient
from shared.remote.fencing import fence_signature
from tests.support.topology import free_port

ADMIN_TOKEN = "in-process-remote-admin-token"
ACCOUNTS = ("", "hub_a", "hub_b")
"""The accounts an in-process remote knows unless told: the unnamed one and two hubs."""


def account_keys(account: str) -> tuple[str, str]:
    """(key, fence key) of a test account."""
    return f"account-key-of-{account}-for-tests", f"fence-key-of-{account}-for-tests"


def accounts_of(*accounts: str) -> Accounts:
    """A remote service's table of these test accounts."""
    return Accounts.parse(",".join(f"{a}:{':'.join(account_keys(a))}" for a in accounts))


def signature(account: str, fencing_token: str) -> str:
    """What the schedulers of the test account `account` sign `fencing_token` with."""
    return fence_signature(account_keys(account)[1].encode(), account, fencing_token)


class SigningClient(RemoteClient):
    """A client of a test account: its key sent with every call, and each call's fencing token
    signed with the account's fence key unless a signature is given."""

    account = ""

    @classmethod
    def of(cls, url: str, account: str = "", *, admin_token: str | None = ADMIN_TOKEN) -> Any:
        client = cls.open(
            url, account=account, account_key=account_keys(account)[0], admin_token=admin_token
        )
        client.account = account
        return client

    async def call(  # type: ignore[override]
        self,
        operation: str,
        *,
        fencing_token: str,
        fencing_signature: str | None = None,
        **rest: Any,
    ) -> dict[str, Any]:
        if fencing_signature is None:
            fencing_signature = signature(self.account, fencing_token)
        return await super().call(
            operation, fencing_token=fencing_token, fencing_signature=fencing_signature, **rest
        )


class InProcessRemote:
    def __init__(self, path: Path, accounts: tuple[str, ...] = ACCOUNTS) -> None:
        self.path = path
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.accounts = accounts
        self.service: RemoteService
        self._runner: web.AppRunner | None = None

    async def start(self, **faults: object) -> None:
        self.service = RemoteService(
            Ledger(str(self.path)),
            Faults(**faults),
            random.Random(3),
            admin_token=ADMIN_TOKEN,
            accounts=accounts_of(*self.accounts),
        )
        self._runner = web.AppRunner(self.service.app())
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()

    async def stop(self) -> None:
        assert self._runner is not None
        await self._runner.cleanup()
        self.service.ledger.close()

    def agent_client(self, *, account: str = "") -> RemoteClient:
        """A client as an agent of `account` holds one: the account's key, no fence key (a
        call carries the signature its request came with, or none)."""
        return RemoteClient.open(
            self.url, account=account, account_key=account_keys(account)[0], admin_token=ADMIN_TOKEN
        )

    def client(self, *, account: str = "") -> SigningClient:
        """A client calling as `account` (with its key, its tokens signed), which may also
        read the ledger and the attempts."""
        client: SigningClient = SigningClient.of(self.url, account)
        return client
