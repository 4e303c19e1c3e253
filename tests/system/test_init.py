"""`orderflow init` on RabbitMQ: the queues' arguments are fixed when first declared; a second
run with the same settings changes nothing, and one with changed queue settings says which
queue and argument, in one line, without touching the queue."""

from __future__ import annotations

import json
import shutil
import subprocess
from typing import Any

import pytest

from tests.system.test_cli import orderflow, servers

__all__ = ["servers"]  # the fixture, shared with test_cli

pytestmark = [pytest.mark.rabbitmq, pytest.mark.postgres]


def queue_arguments(hub: str) -> dict[str, dict[str, Any]]:
    rabbitmqctl = shutil.which("rabbitmqctl")
    if rabbitmqctl is None:
        pytest.fail("rabbitmqctl is needed to read queue arguments")
    listed = subprocess.run(
        [rabbitmqctl, "list_queues", "-q", "name", "arguments", "--formatter", "json"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return {
        q["name"]: {name: value for name, _type, value in q["arguments"]}
        for q in json.loads(listed.stdout)
        if q["name"].startswith(f"{hub}.")
    }


async def test_a_changed_queue_setting_is_refused_in_one_line_and_changes_nothing(
    servers: str,
) -> None:
    hub = servers
    assert orderflow("init", hub=hub).returncode == 0
    before = queue_arguments(hub)
    assert before[f"{hub}.orders"]["x-overflow"] == "reject-publish"
    assert before[f"{hub}.orders"]["x-queue-type"] == "quorum"

    again = orderflow("init", hub=hub)
    assert again.returncode == 0, again.stderr
    assert queue_arguments(hub) == before

    changed = orderflow("init", hub=hub, ORDERFLOW_ORDERS_QUEUE_MAX_LENGTH="7")
    assert changed.returncode == 2
    [line] = changed.stderr.strip().splitlines()
    assert f"queue {hub}.orders exists with other arguments" in line
    assert "x-max-length=7" in line and "Traceback" not in changed.stderr
    assert queue_arguments(hub) == before
