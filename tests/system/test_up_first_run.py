"""The README's first run, as written, in a directory of its own: `orderflow up` on a terminal,
then `orderflow submit` and `orderflow audit` from the same directory with nothing set by hand;
the shop's and the console's logins `up` printed work; a second `up` reuses every credential.
And logs a person reads on a terminal, JSON on a pipe or when asked."""

from __future__ import annotations

import json
import re
import signal
import stat
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest

from shared.config.settings import CREDENTIALS_FILE
from tests.conftest import POSTGRES_URL, RABBITMQ_URL
from tests.support.terminal import OnATerminal
from tests.support.topology import free_port, running_topology
from tests.support.waiting import eventually
from tests.system.test_first_run import clean_env, orderflow

pytestmark = [pytest.mark.rabbitmq, pytest.mark.postgres]

TEXT_LINE = r"\d\d:\d\d:\d\d\.\d{3} "
"""How a text log line starts: its local time."""


def first_run_directory(path: Path, hub: str, api_port: int, remote_port: int) -> str:
    """A `.env` as the README has a newcomer write it (and what keeps this test's own hub and
    ports apart from other tests'): no token, no key, no credential of any kind."""
    dot_env = "".join(
        f"{name}={value}\n"
        for name, value in {
            "ORDERFLOW_STORE_URL": POSTGRES_URL,
            "ORDERFLOW_RABBITMQ_URL": RABBITMQ_URL,
            "ORDERFLOW_HUB": hub,
            "ORDERFLOW_API_PORT": api_port,
            "ORDERFLOW_REMOTE_URL": f"http://127.0.0.1:{remote_port}",
        }.items()
    )
    (path / ".env").write_text(dot_env)
    return dot_env


def logins(output: str) -> dict[str, str]:
    found = dict(re.findall(r"^up: the (shop|console) at \S+, token (oft_\S+) ", output, re.M))
    return found if len(found) == 2 else {}


async def status_of(url: str, token: str) -> int:
    headers = {"Authorization": f"Bearer {token}"}
    async with aiohttp.ClientSession() as session, session.get(url, headers=headers) as r:
        return r.status


async def test_the_first_run_works_as_written_and_the_next_reuses_it(
    hub: str, tmp_path: Path
) -> None:
    api_port, remote_port = free_port(), free_port()
    dot_env = first_run_directory(tmp_path, hub, api_port, remote_port)
    up_args = [sys.executable, "-m", "services.cli", "up"]
    async with running_topology(hub, tmp_path / "cleanup"):  # removes the hub afterwards
        up = OnATerminal(up_args, cwd=tmp_path, env=clean_env())
        try:

            async def ready() -> bool:
                out = up.text()
                return "agent ready" in out and "Uvicorn running" in out

            await eventually(ready, timeout=90, what="up's processes ready")
            shown = up.text()
            # On a terminal every process logs one readable line per event, prefixed by name.
            started = rf"^scheduler-1 +\| {TEXT_LINE}scheduler-\S+ scheduler ready "
            assert re.search(started, shown, re.M)
            assert not re.search(r"^\S+ +\| \{", shown, re.M), "no JSON on a terminal"
            tokens = logins(shown)
            assert tokens, shown
            credentials = tmp_path / CREDENTIALS_FILE
            assert stat.S_IMODE(credentials.stat().st_mode) == 0o600
            assert (tmp_path / ".env").read_text() == dot_env  # the user's file untouched

            submitted = orderflow(tmp_path, "submit", "--count", "5", "--wait")
            assert submitted.returncode == 0, submitted.stderr
            audit = orderflow(tmp_path, "audit")
            assert audit.returncode == 0, audit.stdout + audit.stderr
            assert "audit: ok" in audit.stdout and "5 orders" in audit.stdout

            base = f"http://127.0.0.1:{api_port}"
            assert await status_of(f"{base}/ops/stats", tokens["console"]) == 200
            assert await status_of(f"{base}/orders/o-1", tokens["shop"]) == 404  # its own: none
            assert await status_of(f"{base}/ops/stats", tokens["shop"]) == 403
        finally:
            code = up.stop(signal.SIGTERM)
        assert code == 0, up.text()[-3000:]

        # Again, its output a pipe: the same credentials, and JSON lines from every process.
        kept = credentials.read_text()
        log = tmp_path / "again.log"
        with log.open("wb") as out:
            again = subprocess.Popen(
                up_args, stdout=out, stderr=subprocess.STDOUT, cwd=tmp_path, env=clean_env()
            )
        try:

            async def ready_again() -> str:
                text = log.read_text()
                return text if "agent ready" in text and "Uvicorn running" in text else ""

            text = await eventually(ready_again, timeout=90, what="up ready again")
            assert logins(text) == tokens
            assert credentials.read_text() == kept
            lines = re.findall(r"^scheduler-1 +\| (.*)$", text, re.M)
            assert lines and all(json.loads(line)["hub"] == hub for line in lines)
            assert orderflow(tmp_path, "audit").returncode == 0
            assert await status_of(f"{base}/ops/stats", tokens["console"]) == 200
        finally:
            again.send_signal(signal.SIGTERM)
            assert again.wait(timeout=60) == 0


@pytest.mark.parametrize(("setting", "text"), [(None, True), ("json", False)])
async def test_serve_on_a_terminal_logs_text_unless_asked_for_json(
    tmp_path: Path, setting: str | None, text: bool
) -> None:
    port = free_port()
    env = clean_env(ORDERFLOW_REMOTE_PORT=str(port))
    if setting is not None:
        env["ORDERFLOW_LOG_FORMAT"] = setting
    serve = OnATerminal(
        [sys.executable, "-m", "services.cli", "serve", "remote"], cwd=tmp_path, env=env
    )
    try:

        async def listening() -> str:
            return next((s for s in serve.text().splitlines() if "listening" in s), "")

        line = await eventually(listening, timeout=60, what="the remote stand-in listening")
    finally:
        assert serve.stop(signal.SIGTERM) == 0
    if text:
        assert re.fullmatch(
            rf"{TEXT_LINE}remote-\S+ remote service listening "
            rf"url=http://127.0.0.1:{port} operator_endpoints=false accounts=0",
            line,
        ), line
    else:
        assert json.loads(line)["event"] == "remote service listening"
