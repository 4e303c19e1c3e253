"""`orderflow up` runs the whole topology as processes and stops it on SIGTERM."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest

from shared.domain.states import ProcessState
from tests.support.topology import free_port, running_topology
from tests.support.waiting import eventually

pytestmark = [pytest.mark.rabbitmq, pytest.mark.postgres]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def test_up_runs_every_process_and_stops_them_all(hub: str, tmp_path: Path) -> None:
    api_port = free_port()
    async with running_topology(hub, tmp_path) as topo:
        out = (tmp_path / "up.log").open("wb")
        up = subprocess.Popen(
            [sys.executable, "-m", "services.cli", "up", "--schedulers", "2", "--supervisors", "2"],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=topo.env | {"ORDERFLOW_API_PORT": str(api_port)},
        )
        try:
            await topo.wait_remote()
            result = topo.cli("submit", "--count", "20", "--json")
            assert json.loads(result.stdout)["published"] == 20
            counts = await topo.wait_settled(20, timeout=60)
            assert counts[ProcessState.PROCESSED] == 20
            log = (tmp_path / "up.log").read_text()
            pids = {name: int(pid) for name, pid in re.findall(r"started (\S+) \(pid (\d+)\)", log)}
            assert set(pids) == {
                "remote",
                "submission",
                "scheduler-1",
                "scheduler-2",
                "supervisor-1",
                "supervisor-2",
                "inventory-1",
                "payment-1",
                "shipping-1",
                "api",
            }
            # The API, the shop and the console, on the port it was given.
            assert f"the shop at http://127.0.0.1:{api_port}/" in log

            async def serving() -> bool:
                url = f"http://127.0.0.1:{api_port}/openapi.json"
                try:
                    async with aiohttp.ClientSession() as session, session.get(url) as r:
                        return r.status == 200
                except aiohttp.ClientError:
                    return False

            await eventually(serving, timeout=30, what="the API answering")
            assert re.search(r"^scheduler-2 +\| \{", log, re.M), "output is prefixed with names"
            report = await topo.audit()
            assert report["ok"], report["violations"]

            up.send_signal(signal.SIGTERM)
            assert up.wait(timeout=30) == 0
            assert not [name for name, pid in pids.items() if alive(pid)]
        finally:
            if up.poll() is None:
                up.kill()


async def test_up_reports_a_process_that_dies_and_does_not_restart_it(
    hub: str, tmp_path: Path
) -> None:
    async with running_topology(hub, tmp_path) as topo:
        out = (tmp_path / "up.log").open("wb")
        up = subprocess.Popen(
            [sys.executable, "-m", "services.cli", "up"],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=topo.env | {"ORDERFLOW_API_PORT": str(free_port())},
        )
        try:

            async def started() -> dict[str, int]:
                log = (tmp_path / "up.log").read_text()
                found = dict(re.findall(r"started (\S+) \(pid (\d+)\)", log))
                return {k: int(v) for k, v in found.items()} if len(found) == 8 else {}

            pids = await eventually(started, timeout=30, what="up to start every process")
            os.kill(pids["scheduler-1"], signal.SIGKILL)

            async def reported() -> bool:
                text = (tmp_path / "up.log").read_text()
                return "scheduler-1 exited with code -9 (not restarted)" in text

            await eventually(reported, timeout=10, what="up to report the dead scheduler")
            assert up.poll() is None, "up keeps the other processes running"
            assert alive(pids["submission"])
            up.send_signal(signal.SIGINT)
            assert up.wait(timeout=30) == 0
        finally:
            if up.poll() is None:
                up.kill()
