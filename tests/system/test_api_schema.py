"""A bounded schemathesis run against the API's served OpenAPI document: the shop's endpoints with
a shop's token, the operator's with an operator's, on a running topology. No 5xx, no response
that breaks the document (its status, content type, schema or headers), every refusal of bad
data a 4xx, and no endpoint that answers without a token."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.support.api import ApiClient, start_api, token
from tests.support.topology import Topology, running_topology

pytestmark = [pytest.mark.rabbitmq, pytest.mark.postgres]

EXAMPLES = int(os.environ.get("ORDERFLOW_TEST_SCHEMA_EXAMPLES", "20"))
"""Examples a phase generates per operation (the CI bound; raise it to search longer)."""
CHECKS = ",".join(
    [
        "not_a_server_error",
        "status_code_conformance",
        "content_type_conformance",
        "response_headers_conformance",
        "response_schema_conformance",
        "negative_data_rejection",
        "missing_required_header",
        "unsupported_method",
        "ignored_auth",
    ]
)


@pytest.fixture
async def topo(hub: str, tmp_path: Path) -> AsyncIterator[Topology]:
    async with running_topology(hub, tmp_path) as t:
        yield t


@pytest.fixture
async def api(topo: Topology) -> AsyncIterator[ApiClient]:
    await topo.start_all()
    client = await start_api(topo)
    try:
        yield client
    finally:
        await client.close()


def schemathesis(api: ApiClient, tag: str, secret: str, tmp_path: Path) -> str:
    command = [
        sys.executable, "-m", "schemathesis.cli", "run", f"{api.base}/openapi.json",
        "--include-tag", tag,
        # The live stream ends only when its order is final: tests/system/test_api.py covers it.
        "--exclude-path", "/orders/{order_id}/events",
        "-H", f"Authorization: Bearer {secret}",
        "--checks", CHECKS,
        "--max-examples", str(EXAMPLES),
        "--phases", "examples,coverage,fuzzing",
        "--workers", "1",
        "--seed", "1",
        "--request-timeout", "20",
        "--no-color",
    ]  # fmt: skip
    result = subprocess.run(
        command, capture_output=True, text=True, timeout=900, cwd=tmp_path, check=False
    )
    print(result.stdout[-6000:], result.stderr[-3000:])
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
    return result.stdout


async def test_schemathesis_finds_no_5xx_and_no_response_off_the_document(
    topo: Topology, api: ApiClient, tmp_path: Path
) -> None:
    shop, operator = token(topo, "shop", "acme"), token(topo, "operator", "otto")
    outputs = [
        schemathesis(api, "shop", shop, tmp_path),
        schemathesis(api, "operator", operator, tmp_path),
    ]
    for output in outputs:
        tested = re.search(r"(\d+) generated", output)
        assert tested is not None and int(tested.group(1)) > 0, output[-2000:]
