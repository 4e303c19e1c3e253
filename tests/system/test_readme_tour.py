"""The README's five-minute tour, run as written: its commands, read from the README itself, in
order, against `orderflow up`'s real processes in a directory of their own; what each should
show is checked, and the shop and the console answer.

Only the clock differs: the tour's outage waits for the supervisor to give up on three orders
(about two minutes at the default step timeout, failure threshold and cool-down); here those
settings are shortened in the directory's `.env`, so it takes seconds. `./orderflow` is the
checkout's wrapper, which installs on first use; here it is this interpreter's `orderflow`."""

from __future__ import annotations

import re
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest

from tests.conftest import POSTGRES_URL, RABBITMQ_URL
from tests.support.topology import free_port, running_topology
from tests.support.waiting import eventually
from tests.system.test_first_run import clean_env

pytestmark = [pytest.mark.rabbitmq, pytest.mark.postgres]

README = Path(__file__).resolve().parents[2] / "README.md"
ORDERFLOW = [sys.executable, "-m", "services.cli"]

EXPECTED: list[tuple[int, str]] = [
    (0, r"Completed: 20"),
    (0, r"Processed\s*│\s*20\b"),
    (0, r"20 orders, .*\naudit: ok"),
    (0, r"outage: on"),
    (1, r"Failed: 3"),
    (0, r"(?s)(.*ord-[0-9a-f]{20}){3}"),
    (0, r"outage: off"),
    (0, r"3 changed, 0 refused"),
    (0, r"Processed\s*│\s*23\b"),
    (0, r"23 orders, .*\naudit: ok"),
]
"""Per command of the tour, in order: its exit code and what its output shows."""

LATER = "a few seconds later"
"""A command whose comment says this may be run again until it shows what it should."""


def tour_commands(readme: str) -> list[tuple[list[str], str]]:
    """The tour's commands (`./orderflow` replaced by this interpreter's) and their comments."""
    marker = readme.index("<!-- tour:")
    block = re.search(r"```sh\n(.*?)```", readme[marker:], re.S)
    assert block is not None, "the tour's code block follows its marker"
    commands = []
    for line in block.group(1).splitlines():
        command, _, comment = line.partition("#")
        words = shlex.split(command)
        assert words[0] == "./orderflow", line
        commands.append((ORDERFLOW + words[1:], comment.strip()))
    return commands


async def answers(url: str) -> int:
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        return response.status


async def test_the_readme_tour_works_as_written(hub: str, tmp_path: Path) -> None:
    commands = tour_commands(README.read_text())
    assert len(commands) == len(EXPECTED), "the tour changed: update EXPECTED with it"
    api_port, remote_port = free_port(), free_port()
    settings = {
        "ORDERFLOW_STORE_URL": POSTGRES_URL,
        "ORDERFLOW_RABBITMQ_URL": RABBITMQ_URL,
        "ORDERFLOW_HUB": hub,
        "ORDERFLOW_API_PORT": api_port,
        "ORDERFLOW_REMOTE_URL": f"http://127.0.0.1:{remote_port}",
        # The outage's clock, shortened (see the module's docstring).
        "ORDERFLOW_STEP_TIMEOUT_S": 2,
        "ORDERFLOW_FAILURE_THRESHOLD": 2,
        "ORDERFLOW_SUPERVISOR_INTERVAL_S": 0.5,
        "ORDERFLOW_BREAKER_RESET_S": 1,
    }
    (tmp_path / ".env").write_text("".join(f"{k}={v}\n" for k, v in settings.items()))
    env = clean_env(COLUMNS="200")
    async with running_topology(hub, tmp_path / "cleanup"):  # removes the hub afterwards
        log = tmp_path / "up.log"
        with log.open("wb") as out:
            up = subprocess.Popen(
                [*ORDERFLOW, "up"], stdout=out, stderr=subprocess.STDOUT, cwd=tmp_path, env=env
            )
        try:

            async def ready() -> bool:
                text = log.read_text()
                return "agent ready" in text and "Uvicorn running" in text

            await eventually(ready, timeout=90, what="up's processes ready")
            # A newcomer's first screen holds no warning: starting is not stalling.
            assert "a consumer is not taking messages" not in log.read_text()
            for (command, comment), (code, shows) in zip(commands, EXPECTED, strict=True):

                async def run(command: list[str] = command) -> subprocess.CompletedProcess[str]:
                    return subprocess.run(
                        command, capture_output=True, text=True, cwd=tmp_path, env=env, timeout=320
                    )

                async def shown(
                    command: list[str] = command, code: int = code, shows: str = shows
                ) -> subprocess.CompletedProcess[str] | None:
                    result = await run(command)
                    good = result.returncode == code and re.search(shows, result.stdout)
                    return result if good else None

                if LATER in comment:
                    await eventually(shown, timeout=60, what=f"{shlex.join(command)}: {shows}")
                    continue
                result = await run()
                said = f"{shlex.join(command)} ->\n{result.stdout}{result.stderr}"
                assert result.returncode == code, said
                assert re.search(shows, result.stdout), said
            base = f"http://127.0.0.1:{api_port}"
            assert await answers(f"{base}/") == 200  # the shop
            assert await answers(f"{base}/console") == 200
        finally:
            up.send_signal(signal.SIGTERM)
            assert up.wait(timeout=60) == 0, log.read_text()[-3000:]
