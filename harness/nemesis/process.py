"""One private server's directory, watchdog and process, and its lifecycle: what PostgreSQL and
RabbitMQ share (servers.py).

The server runs as a child process in a session of its own, so a Ctrl-C at the terminal reaches
the test run, which stops its servers, and not the servers themselves. A watchdog (`reaper.py`)
holds a pipe from this process: should it die without cleaning up (SIGKILL, a crash), the pipe
closes, and the watchdog kills the server's process group by its pid file and removes the
directory, so no orphan server outlives a crashed run.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Self

from tenacity import RetryError, Retrying, retry_if_result, stop_after_delay, wait_fixed

from harness.nemesis.reaper import MARKER
from shared.errors import ServerError, ServerFailed, ServerMissing

READY_POLL_S = 0.1
"""How often a starting server is asked whether it is ready."""
STOP_TIMEOUT_S = 30.0
"""How long a clean shutdown may take before the server is killed."""
CLIENT_TIMEOUT_S = 30.0
"""The deadline of one client command (`pg_isready`, `createdb`, `rabbitmqctl`)."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def listening(port: int) -> bool:
    """Whether something accepts TCP connections on 127.0.0.1:`port`."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


@dataclass(frozen=True)
class RunAs:
    """The OS user a server runs as, when it must not run as root (PostgreSQL)."""

    uid: int
    gid: int
    groups: list[int]

    @classmethod
    def named(cls, name: str) -> RunAs:
        try:
            entry = pwd.getpwnam(name)
        except KeyError:
            raise ServerMissing(f"running as root, and there is no {name!r} user") from None
        return cls(entry.pw_uid, entry.pw_gid, os.getgrouplist(name, entry.pw_gid))


def run(argv: list[str], *, env: dict[str, str], cwd: Path, run_as: RunAs | None = None) -> str:
    """Run a command to completion; its stdout, or ServerFailed naming it with its last words."""
    try:
        done = subprocess.run(
            argv,
            check=False,
            capture_output=True,
            text=True,
            env=env,
            cwd=cwd,
            timeout=CLIENT_TIMEOUT_S * 4,
            user=run_as.uid if run_as else None,
            group=run_as.gid if run_as else None,
            extra_groups=run_as.groups if run_as else None,
        )
    except subprocess.TimeoutExpired:
        raise ServerFailed(f"{Path(argv[0]).name} timed out") from None
    if done.returncode != 0:
        words = last_lines(done.stderr or done.stdout)
        raise ServerFailed(f"{Path(argv[0]).name} failed (exit {done.returncode}): {words}")
    return done.stdout


def last_lines(text: str, count: int = 5) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return " | ".join(lines[-count:]) or "(no output)"


class _Reaper:
    """The watchdog of one directory (reaper.py): started first, released last."""

    def __init__(self, base: Path) -> None:
        script = Path(__file__).with_name("reaper.py")
        self._proc = subprocess.Popen(
            [sys.executable, "-I", str(script), str(base)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        assert self._proc.stdout is not None
        if self._proc.stdout.readline().strip() != b"watching":
            self.release()
            raise ServerFailed(f"the watchdog of {base} did not start")

    def release(self) -> None:
        """Close its pipe: it reaps what is left (nothing, after a clean stop) and exits."""
        if self._proc.stdin is not None:
            self._proc.stdin.close()
        try:
            self._proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        if self._proc.stdout is not None:
            self._proc.stdout.close()


class PrivateServer:
    """What both servers share: the directory, the watchdog, the process and its lifecycle."""

    kind: ClassVar[str]
    """The server's name in messages."""
    stop_signal: ClassVar[signal.Signals]
    """The signal asking the server for a clean shutdown."""
    foreign_environment: ClassVar[tuple[str, ...]]
    """Prefixes of environment variables not passed on: the machine's settings for its server."""

    def __init__(self, *, startup_timeout: float) -> None:
        self.startup_timeout = startup_timeout
        self.port = free_port()
        self.run_as: RunAs | None = None
        self._base: Path | None = None
        self._reaper: _Reaper | None = None
        self._proc: subprocess.Popen[bytes] | None = None

    # -- to be provided by each server
    def _prepare(self) -> None:
        """Fill the fresh directory (configuration, data) before the first start."""

    def _argv(self) -> list[str]:
        raise NotImplementedError

    def _settings(self) -> dict[str, str]:
        return {}

    def _ready(self) -> bool:
        raise NotImplementedError

    def _created(self) -> None:
        """After the first start: what the server must hold before anyone uses it."""

    def _discard(self) -> None:
        """Stop it for good, its data about to be removed."""
        self.stop()

    # -- the lifecycle
    @property
    def base(self) -> Path:
        """The server's directory: its data, configuration, log and pid files."""
        if self._base is None:
            raise ServerError(f"the private {self.kind} is not set up: use it in a `with`")
        return self._base

    @property
    def log_path(self) -> Path:
        return self.base / "server.log"

    @property
    def pid(self) -> int | None:
        """The server's process (the leader of its process group), while it runs."""
        return self._proc.pid if self.running and self._proc is not None else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def __enter__(self) -> Self:
        self._base = Path(tempfile.mkdtemp(prefix=f"orderflow-nemesis-{self.kind.lower()}-"))
        try:
            self._reaper = _Reaper(self._base)
            self._prepare()
            self.start()
            self._created()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def environment(self) -> dict[str, str]:
        """The server's environment, and its own clients'."""
        kept = {k: v for k, v in os.environ.items() if not k.startswith(self.foreign_environment)}
        return kept | self._settings() | {MARKER: str(self.base)}

    def start(self) -> None:
        """Start the server on its port and data; return once it answers."""
        if self.running:
            raise ServerError(f"the private {self.kind} on port {self.port} is already running")
        with self.log_path.open("ab") as log:
            self._proc = subprocess.Popen(
                self._argv(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.environment(),
                cwd=self.base,
                start_new_session=True,
                user=self.run_as.uid if self.run_as else None,
                group=self.run_as.gid if self.run_as else None,
                extra_groups=self.run_as.groups if self.run_as else None,
            )
        # Its session's id is its pid: the watchdog kills the whole group by it.
        (self.base / "server.pgid").write_text(f"{self._proc.pid}\n")
        self.wait_until(self._ready, f"the private {self.kind} did not start on port {self.port}")

    def stop(self) -> None:
        """A clean shutdown, its data kept; killed if it takes longer than STOP_TIMEOUT_S."""
        proc = self._proc
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(self.stop_signal)
        try:
            proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.kill()
            raise ServerFailed(
                f"the private {self.kind} did not stop within {STOP_TIMEOUT_S:g} s and was "
                f"killed; {self.log_tail()}"
            ) from None

    def kill(self) -> None:
        """SIGKILL every process of the server at once, as a crash would."""
        proc = self._proc
        if proc is None or proc.poll() is not None:
            return
        with suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=STOP_TIMEOUT_S)

    def restart(self) -> None:
        self.stop()
        self.start()

    def close(self) -> None:
        """Stop the server and remove its directory, whatever state it is in."""
        try:
            self._discard()
        finally:
            self.kill()
            if self._base is not None:
                shutil.rmtree(self._base, ignore_errors=True)
            if self._reaper is not None:
                self._reaper.release()
                self._reaper = None

    def wait_until(self, ready: Callable[[], bool], failure: str) -> None:
        """Poll `ready` until it holds; ServerFailed with the log's tail if the server exits or
        the startup timeout passes first."""

        def attempt() -> bool:
            if self._proc is None or self._proc.poll() is not None:
                code = self._proc.returncode if self._proc else None
                raise ServerFailed(f"{failure}: it exited with {code}; {self.log_tail()}")
            return ready()

        polls = Retrying(
            stop=stop_after_delay(self.startup_timeout),
            wait=wait_fixed(READY_POLL_S),
            retry=retry_if_result(lambda ok: not ok),
        )
        try:
            polls(attempt)
        except RetryError:
            raise ServerFailed(
                f"{failure} within {self.startup_timeout:g} s; {self.log_tail()}"
            ) from None

    def log_tail(self) -> str:
        try:
            text = self.log_path.read_bytes()[-4096:].decode(errors="replace")
        except (OSError, ServerError):
            return "no server log"
        return f"the end of {self.log_path}: {last_lines(text)}"
