"""`./orderflow`, the checkout's command: it runs the installed CLI with the arguments given, and
chooses the machine's PostgreSQL in a new `.env` only for `up` run in the checkout itself with no
store chosen (a review found it writing `.env` into whatever directory any command ran from).
The install itself is what a fresh clone's first run does (shown in the docs' getting started);
here the installation is stubbed by a stamp that matches, and the CLI by a script that echoes."""

from __future__ import annotations

import hashlib
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), 1).close()
    except OSError:
        return False
    return True


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    root = tmp_path / "checkout"
    (root / "requirements").mkdir(parents=True)
    shutil.copy(ROOT / "orderflow", root / "orderflow")
    shutil.copy(ROOT / "requirements" / "runtime.lock", root / "requirements" / "runtime.lock")
    shutil.copy(ROOT / "pyproject.toml", root / "pyproject.toml")
    bin_dir = root / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "python").symlink_to(sys.executable)
    cli = bin_dir / "orderflow"
    cli.write_text('#!/bin/sh\necho "cli: $*"\n')
    cli.chmod(0o755)
    lock = (root / "requirements" / "runtime.lock").read_bytes()
    digest = hashlib.sha256(lock + (root / "pyproject.toml").read_bytes()).hexdigest()
    (root / ".venv" / ".orderflow-lock").write_text(digest + "\n")
    return root


def run(cwd: Path, script: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORDERFLOW_")}
    return subprocess.run(
        [str(script), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=60
    )


def test_it_runs_the_installed_cli_with_the_arguments_given(checkout: Path) -> None:
    result = run(checkout, checkout / "orderflow", "submit", "--count", "2")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "cli: submit --count 2\n"
    assert "installing" not in result.stderr  # the stamp matches: nothing to install


@pytest.mark.skipif(
    not listening(5432) or listening(27017), reason="needs PostgreSQL on 5432 and no MongoDB"
)
def test_only_up_in_the_checkout_with_no_store_chosen_writes_a_dot_env(
    checkout: Path, tmp_path: Path
) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    assert run(elsewhere, checkout / "orderflow", "up").returncode == 0
    assert not (elsewhere / ".env").exists(), "not in a directory it was merely run from"
    assert run(checkout, checkout / "orderflow", "--help").returncode == 0
    assert run(checkout, checkout / "orderflow", "up", "--store-url", "mongodb://x").returncode == 0
    assert not (checkout / ".env").exists(), "not for another command, nor a store given"

    result = run(checkout, checkout / "orderflow", "up")
    assert result.returncode == 0 and result.stdout == "cli: up\n"
    assert (checkout / ".env").read_text() == (
        "ORDERFLOW_STORE_URL=postgresql://postgres@127.0.0.1:5432/test\n"
    )
    assert "wrote .env choosing it" in result.stderr

    (checkout / ".env").write_text("ORDERFLOW_HUB=mine\n")
    assert run(checkout, checkout / "orderflow", "up").returncode == 0
    assert (checkout / ".env").read_text() == "ORDERFLOW_HUB=mine\n", "a .env is never replaced"
