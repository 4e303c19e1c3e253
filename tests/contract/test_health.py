"""`/healthz` and `orderflow health` over real HTTP: what a container healthcheck sees."""

from __future__ import annotations

import asyncio
import subprocess
import sys

from shared.metrics import serve_metrics
from tests.support.topology import free_port


async def health(*args: str) -> subprocess.CompletedProcess[str]:
    """`python -m services.cli.health …`, the command the compose healthchecks run."""
    command = [sys.executable, "-m", "services.cli.health", *args]
    return await asyncio.to_thread(subprocess.run, command, capture_output=True, text=True)


async def test_healthy_while_every_check_passes_and_unhealthy_when_one_fails() -> None:
    endpoint = await serve_metrics(free_port())
    assert endpoint is not None
    checks = {"broker": True, "store": True}

    async def check() -> dict[str, bool]:
        return dict(checks)

    try:
        up = await health("--port", str(endpoint.port))  # no checks yet: the process answers
        assert up.returncode == 0, up.stderr
        endpoint.set_health(check)
        ok = await health("--port", str(endpoint.port))
        assert ok.returncode == 0 and '"broker": true' in ok.stdout
        checks["store"] = False
        failing = await health("--port", str(endpoint.port))
        assert failing.returncode == 1
        assert '"store": false' in failing.stderr and "503" in failing.stderr
    finally:
        await endpoint.close()


async def test_a_check_that_raises_or_hangs_is_unhealthy(monkeypatch) -> None:
    monkeypatch.setattr("shared.metrics.HEALTH_TIMEOUT_S", 0.2)
    endpoint = await serve_metrics(free_port())
    assert endpoint is not None

    async def hangs() -> dict[str, bool]:
        await asyncio.sleep(10)
        return {}

    try:
        endpoint.set_health(hangs)
        assert (await health("--port", str(endpoint.port))).returncode == 1
    finally:
        await endpoint.close()


async def test_nothing_listening_no_port_or_another_url() -> None:
    assert (await health("--port", str(free_port()))).returncode == 1
    no_port = await health("--port", "0")
    assert no_port.returncode == 1 and "ORDERFLOW_METRICS_PORT is 0" in no_port.stderr
    bad = await health("--url", f"http://127.0.0.1:{free_port()}/health", "--timeout", "1")
    assert bad.returncode == 1 and "does not answer" in bad.stderr
