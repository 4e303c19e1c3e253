"""The HTTP API of a running topology, for system and browser tests: start `serve api` on a
free port, make tokens with the real CLI, and call it over real HTTP."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp

from tests.support.topology import Topology, free_port
from tests.support.waiting import eventually


@dataclass
class Answer:
    status: int
    body: Any
    headers: dict[str, str]


class ApiClient:
    def __init__(self, base: str) -> None:
        self.base = base
        self.session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30))

    async def close(self) -> None:
        await self.session.close()

    async def call(
        self, method: str, path: str, token: str | None = None, body: Any = None, **params: Any
    ) -> Answer:
        headers = {} if token is None else {"Authorization": f"Bearer {token}"}
        query = {k: v for k, v in params.items() if v is not None}
        async with self.session.request(
            method, self.base + path, headers=headers, params=query, json=body
        ) as response:
            text = await response.text()
            try:
                data = json.loads(text) if text else None
            except json.JSONDecodeError:
                data = text
            return Answer(response.status, data, dict(response.headers))

    async def events(self, path: str, token: str) -> AsyncIterator[tuple[str, Any]]:
        """The server-sent events of a stream, (event name, data) each, until it ends."""
        headers = {"Authorization": f"Bearer {token}"}
        timeout = aiohttp.ClientTimeout(total=120)
        async with self.session.get(self.base + path, headers=headers, timeout=timeout) as r:
            assert r.status == 200, await r.text()
            assert r.headers["Content-Type"].startswith("text/event-stream")
            name, data = "message", ""
            async for raw in r.content:
                line = raw.decode().rstrip("\n")
                if line.startswith("event: "):
                    name = line[7:]
                elif line.startswith("data: "):
                    data += line[6:]
                elif not line and data:
                    yield name, json.loads(data)
                    name, data = "message", ""


def token(topo: Topology, role: str, name: str) -> str:
    result = topo.cli("tokens", "create", "--role", role, "--name", name, "--json")
    assert result.returncode == 0, result.stdout + result.stderr
    return str(json.loads(result.stdout)["token"])


async def start_api(topo: Topology, **env: str) -> ApiClient:
    port = free_port()
    topo.serve("api", "api", ORDERFLOW_API_PORT=str(port), **env)
    client = ApiClient(f"http://127.0.0.1:{port}")

    async def up() -> bool:
        try:
            return (await client.call("GET", "/openapi.json")).status == 200
        except aiohttp.ClientError:
            return False

    await eventually(up, timeout=60, what="the API answering")
    return client
