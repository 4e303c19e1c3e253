"""The metrics endpoint over real HTTP: what it serves, and a port it cannot have."""

from __future__ import annotations

import aiohttp
import pytest

from shared.errors import ConfigurationError
from shared.metrics import CLAIMS, serve_metrics
from tests.support.topology import free_port


async def test_no_port_no_endpoint() -> None:
    assert await serve_metrics(0) is None


async def test_the_endpoint_serves_the_registry_in_prometheus_text_format() -> None:
    endpoint = await serve_metrics(free_port())
    assert endpoint is not None
    try:
        CLAIMS.labels("forward").inc(3)
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"http://127.0.0.1:{endpoint.port}/metrics") as response,
        ):
            assert response.status == 200
            assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
            text = await response.text()
        # Other tests in the same process may have counted other kinds first.
        forward = 'orderflow_claims_total{kind="forward"} '
        line = next(ln for ln in text.splitlines() if ln.startswith(forward))
        assert float(line.split()[-1]) >= 3
    finally:
        await endpoint.close()


async def test_a_port_in_use_is_a_configuration_error_naming_the_setting() -> None:
    endpoint = await serve_metrics(free_port())
    assert endpoint is not None
    try:
        with pytest.raises(ConfigurationError, match="ORDERFLOW_METRICS_PORT: cannot listen"):
            await serve_metrics(endpoint.port)
    finally:
        await endpoint.close()
