"""A process run on a terminal of its own (a pseudo-terminal), as a person runs it: its stdout
and stderr are a tty, so it chooses what it shows a person (`ORDERFLOW_LOG_FORMAT=auto`)."""

from __future__ import annotations

import contextlib
import os
import pty
import subprocess
import threading
from pathlib import Path


class OnATerminal:
    """`args` run in `cwd` on a pty; what it wrote so far is `text()` (line ends as `\\n`)."""

    def __init__(self, args: list[str], *, cwd: Path, env: dict[str, str]) -> None:
        main, other = pty.openpty()
        self.proc = subprocess.Popen(
            args, stdin=subprocess.DEVNULL, stdout=other, stderr=other, cwd=cwd, env=env
        )
        os.close(other)
        self._main = main
        self._output = bytearray()
        self._lock = threading.Lock()
        # Read all along: a terminal whose buffer fills would block the process.
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        while True:
            try:
                chunk = os.read(self._main, 65536)
            except OSError:  # EIO: every writer is gone
                return
            if not chunk:
                return
            with self._lock:
                self._output += chunk

    def text(self) -> str:
        with self._lock:
            return self._output.decode(errors="replace").replace("\r\n", "\n")

    def stop(self, sig: int, *, timeout: float = 30) -> int:
        """Signal it and wait for it to exit (killed past `timeout`); its exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait(timeout=10)
        finally:
            self._reader.join(timeout=10)
            with contextlib.suppress(OSError):
                os.close(self._main)
