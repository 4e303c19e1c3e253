"""The watchdog of one private server's directory: if its owner dies without cleaning up, it kills
the servers recorded there and removes the directory.

Run as a script (`python -I reaper.py DIR`), not as a module: it imports the standard library only,
so it starts whatever the owner's working directory or `sys.path`. It says `watching` on stdout,
then reads stdin until end of file. The owner holds the only write end of that pipe, and the kernel
closes it however the owner ends (a clean exit, an exception, SIGKILL), so end of file is the one
signal this needs: no polling of the owner's pid, which could be reused.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
from contextlib import suppress
from pathlib import Path

PID_FILE_PATTERN = "*.pgid"
"""The files naming a process group to kill: one per server process, written when it starts."""
MARKER = "ORDERFLOW_NEMESIS_DIR"
"""In every private server's environment, naming its directory: a pid file's process is killed
only if it carries the marker of this directory, so a stale file never kills a stranger."""


def belongs(pid: int, base: Path) -> bool:
    """Whether process `pid` is one of this directory's servers (without /proc: trust the file)."""
    proc = Path("/proc")
    if not proc.is_dir():
        return True
    try:
        environ = (proc / str(pid) / "environ").read_bytes()
    except OSError:
        return False
    return f"{MARKER}={base}".encode() in environ.split(b"\0")


def reap(base: Path) -> None:
    """SIGKILL every process group recorded in `base`, then remove it."""
    for pid_file in base.glob(PID_FILE_PATTERN):
        try:
            pid = int(pid_file.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue
        if belongs(pid, base):
            with suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
    shutil.rmtree(base, ignore_errors=True)


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(f"usage: {argv[0]} DIRECTORY", file=sys.stderr)
        return 2
    base = Path(argv[1])
    print("watching", flush=True)
    sys.stdin.buffer.read()
    reap(base)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
