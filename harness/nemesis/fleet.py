"""The nemesis's processes: every orderflow process as an OS process of its own, started, killed
with SIGKILL, restarted with other settings, and stopped; each one's output in a log file."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

STOP_TIMEOUT_S = 15.0
"""How long a process may take to stop on SIGTERM before it is killed."""


class Fleet:
    def __init__(self, workdir: Path, env: dict[str, str], hub: str) -> None:
        self.workdir = workdir
        self.env = env
        self.hub = hub
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.args: dict[str, list[str]] = {}
        self.restarts = 0

    def start(self, label: str, args: list[str], **env: str) -> None:
        """Start `orderflow serve <args>` as `label` (not running yet, or no longer)."""
        running = self.procs.get(label)
        if running is not None and running.poll() is None:
            raise RuntimeError(f"{label} is already running")
        self.args[label] = args
        log = (self.workdir / f"{label}.log").open("ab")
        try:
            self.procs[label] = subprocess.Popen(
                [
                    *(sys.executable, "-m", "services.cli", "serve"),
                    *(*args, "--name", f"{self.hub}-{label}"),
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env | env,
                start_new_session=True,
            )
        finally:
            log.close()

    def kill(self, label: str) -> None:
        """SIGKILL, as a crash or `kill -9` would end it."""
        proc = self.procs[label]
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=STOP_TIMEOUT_S)

    def stop(self, label: str) -> int | None:
        proc = self.procs[label]
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                return proc.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=STOP_TIMEOUT_S)
                return None
        return proc.returncode

    def restart(
        self, label: str, env: dict[str, str] | None = None, *, crash: bool = False
    ) -> None:
        """Stop (SIGTERM, or SIGKILL when `crash`) and start again with `env` added."""
        (self.kill if crash else self.stop)(label)
        self.restarts += 1
        self.start(label, self.args[label], **(env or {}))

    def dead(self) -> list[str]:
        """The processes that exited on their own."""
        return [label for label, proc in self.procs.items() if proc.poll() is not None]

    def stop_all(self) -> dict[str, int | None]:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        codes: dict[str, int | None] = {}
        for label in self.procs:
            codes[label] = self.stop(label)
        return codes

    def log(self, label: str) -> str:
        path = self.workdir / f"{label}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def cli(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "services.cli", *args],
            capture_output=True,
            text=True,
            env=self.env,
            timeout=timeout,
            check=False,
        )


def environment() -> dict[str, str]:
    """This process's environment without any `ORDERFLOW_` setting: the nemesis sets its own."""
    return {k: v for k, v in os.environ.items() if not k.startswith("ORDERFLOW_")}
