"""A newcomer's first run: the real `orderflow` command in a directory of its own.

`.env` is read (and the environment wins over it), an unreachable MongoDB says how to choose
PostgreSQL, a hub never initialised names `orderflow init`, and no error shows a credential;
`up` stops at a port in use, and its children die with it, even when it is killed.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest

from tests.conftest import POSTGRES_URL, RABBITMQ_URL
from tests.support.topology import free_port, running_topology
from tests.support.waiting import eventually

pytestmark = [pytest.mark.rabbitmq, pytest.mark.postgres]

REPO = Path(__file__).resolve().parents[2]


def clean_env(**env: str) -> dict[str, str]:
    """The environment without any ORDERFLOW_* variable of the shell that runs the tests."""
    kept = {k: v for k, v in os.environ.items() if not k.startswith("ORDERFLOW_")}
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    return kept | {"PYTHONPATH": path, "ORDERFLOW_CONNECT_TIMEOUT_S": "2"} | env


def orderflow(cwd: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "services.cli", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=clean_env(**env),
        timeout=60,
    )


def one_error_line(result: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("orderflow: error: ")
    return lines[0]


def env_file(path: Path, hub: str, *extra: str) -> Path:
    # What a compose .env holds besides orderflow's settings must not trouble the CLI.
    path.write_text(
        "\n".join(
            [
                "# the deployment's .env",
                "COMPOSE_PROFILES=postgresql",
                "SECRETS_DIR=./secrets",
                "POSTGRES_IMAGE=postgres:16",
                "ORDERFLOW_STORE_URL_NOT_A_SETTING=${SOMETHING}",
                f"ORDERFLOW_STORE_URL={POSTGRES_URL}",
                f"ORDERFLOW_RABBITMQ_URL={RABBITMQ_URL}",
                f"ORDERFLOW_HUB={hub}",
                "ORDERFLOW_LOG_LEVEL=",
                *extra,
            ]
        )
        + "\n"
    )
    return path


def test_the_cli_reads_dot_env_and_the_environment_wins(hub: str, tmp_path: Path) -> None:
    env_file(tmp_path / ".env", hub)
    # The hub and the store come from .env: a hub never initialised, in the file's store.
    from_file = one_error_line(orderflow(tmp_path, "orders", "list"))
    assert f"hub '{hub}' is not initialised in the store (PostgreSQL)" in from_file
    # A variable set in the environment wins over the file's line.
    from_env = one_error_line(orderflow(tmp_path, "orders", "list", ORDERFLOW_HUB=f"{hub}_env"))
    assert f"hub '{hub}_env' is not initialised" in from_env
    # A bad value in the file is a configuration error that names it.
    env_file(tmp_path / ".env", hub, "ORDERFLOW_PREFETCH=0")
    bad = orderflow(tmp_path, "orders", "list")
    assert bad.returncode == 2
    assert "ORDERFLOW_PREFETCH" in one_error_line(bad)


def test_orderflow_env_file_names_another_file(hub: str, tmp_path: Path) -> None:
    (tmp_path / ".env").write_text("ORDERFLOW_PREFETCH=0\n")  # not read: another file is named
    other = env_file(tmp_path / "staging.env", hub)
    named = orderflow(tmp_path, "orders", "list", ORDERFLOW_ENV_FILE=str(other))
    assert f"hub '{hub}' is not initialised" in one_error_line(named)
    missing = orderflow(tmp_path, "orders", "list", ORDERFLOW_ENV_FILE="nowhere.env")
    assert missing.returncode == 2
    assert "ORDERFLOW_ENV_FILE: no file 'nowhere.env'" in one_error_line(missing)


def test_an_uninitialised_hub_names_orderflow_init(hub: str, tmp_path: Path) -> None:
    env = {"ORDERFLOW_STORE_URL": POSTGRES_URL, "ORDERFLOW_RABBITMQ_URL": RABBITMQ_URL}
    for command in (["orders", "list"], ["orders", "show", "o-1"], ["dlq", "list"]):
        result = orderflow(tmp_path, *command, ORDERFLOW_HUB=hub, **env)
        assert result.returncode == 1
        line = one_error_line(result)
        assert f"hub '{hub}' is not initialised" in line, command
        assert "run `orderflow init`" in line
        assert "Undefined" not in line and "unexpected" not in line


def test_an_unreachable_mongodb_says_how_to_choose_postgresql(tmp_path: Path) -> None:
    store = f"mongodb://127.0.0.1:{free_port()}"
    result = orderflow(tmp_path, "orders", "list", ORDERFLOW_STORE_URL=store)
    assert result.returncode == 3
    line = one_error_line(result)
    assert "MongoDB" in line
    assert "ORDERFLOW_STORE_URL=postgresql://" in line


@pytest.mark.parametrize(
    "store",
    [
        "postgresql://alice-user:s3cret-pw@127.0.0.1:{port}/db",
        "postgresql://alice-user@127.0.0.1:{port},127.0.0.1:{port}/db?password=s3cret-pw",
        "mongodb://alice-user:s3cret-pw@127.0.0.1:{port}/?authSource=admin",
    ],
)
def test_no_error_shows_a_credential(tmp_path: Path, store: str) -> None:
    url = store.format(port=free_port())
    result = orderflow(tmp_path, "orders", "list", ORDERFLOW_STORE_URL=url)
    line = one_error_line(result)
    assert "127.0.0.1" in line  # the URL is there, masked
    assert "s3cret-pw" not in result.stderr + result.stdout
    assert "alice-user" not in result.stderr + result.stdout


def up_command(cwd: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return orderflow(cwd, "up", *args, ORDERFLOW_STORE_URL=POSTGRES_URL, **env)


@pytest.mark.parametrize(
    ("args", "setting", "what"),
    [
        ((), "ORDERFLOW_REMOTE_PORT", "the remote service"),
        (("--no-remote",), "ORDERFLOW_API_PORT", "the API"),
        (("--no-remote", "--no-api", "--metrics-port", "{port}"), None, "metrics"),
    ],
)
def test_up_stops_at_a_port_in_use(
    tmp_path: Path, args: tuple[str, ...], setting: str | None, what: str
) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        env = {"ORDERFLOW_REMOTE_PORT": str(free_port()), "ORDERFLOW_API_PORT": str(free_port())}
        if setting is not None:
            env[setting] = str(port)
        result = up_command(tmp_path, *(a.format(port=port) for a in args), **env)
    assert result.returncode == 2
    line = one_error_line(result)
    assert f"port {port} on " in line and what in line and "in use" in line
    assert "started" not in result.stdout  # nothing was started


def test_the_remote_stand_in_stops_at_a_port_in_use(tmp_path: Path) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        result = orderflow(
            tmp_path,
            "serve",
            "remote",
            ORDERFLOW_REMOTE_PORT=str(port),
            ORDERFLOW_REMOTE_LEDGER_PATH=str(tmp_path / "ledger.sqlite3"),
        )
    assert result.returncode == 2
    line = one_error_line(result)
    assert f"cannot listen on 127.0.0.1:{port}" in line and "ORDERFLOW_REMOTE_PORT" in line


def process_gone(pid: int) -> bool:
    """Exited (a zombie not yet reaped by whoever inherited it counts as exited)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return True
    return "\nState:\tZ" in status


async def test_up_killed_with_sigkill_leaves_no_orphan(hub: str, tmp_path: Path) -> None:
    remote_port = free_port()  # not the port of ORDERFLOW_REMOTE_URL: the setting moves it
    async with running_topology(hub, tmp_path) as topo:
        log_path = tmp_path / "up.log"
        with log_path.open("wb") as out:
            up = subprocess.Popen(
                [sys.executable, "-m", "services.cli", "up", "--no-api"],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=topo.env | {"ORDERFLOW_REMOTE_PORT": str(remote_port)},
            )
        try:

            async def started() -> dict[str, int]:
                found = dict(re.findall(r"started (\S+) \(pid (\d+)\)", log_path.read_text()))
                return {k: int(v) for k, v in found.items()} if len(found) == 7 else {}

            pids = await eventually(started, timeout=60, what="up to start every process")

            async def remote_answers() -> bool:
                url = f"http://127.0.0.1:{remote_port}/health"
                try:
                    async with aiohttp.ClientSession() as session, session.get(url) as r:
                        return r.status == 200
                except aiohttp.ClientError:
                    return False

            await eventually(remote_answers, timeout=60, what="the remote on its own port")
            assert f"remote stand-in at http://127.0.0.1:{remote_port}" in log_path.read_text()
            up.send_signal(signal.SIGKILL)
            up.wait(timeout=10)

            async def all_gone() -> bool:
                return all(process_gone(pid) for pid in pids.values())

            await eventually(all_gone, timeout=60, what="every child of up to exit")
        finally:
            if up.poll() is None:
                up.kill()
