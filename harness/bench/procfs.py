"""What /proc says of the processes a benchmark measures and of the whole machine (Linux)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
SERVERS = {"beam.smp": "rabbitmq (server)", "postgres": "postgresql (server)"}
"""Local server processes whose CPU the report shows too (by /proc comm name)."""


@dataclass
class ProcUsage:
    """CPU seconds and peak resident memory of one process, read from /proc."""

    cpu_s: float
    peak_rss_mib: float
    rss_mib: float


def proc_usage(pid: int) -> ProcUsage | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime, stime
    kib = {
        line.split(":")[0]: int(line.split()[1])
        for line in status.splitlines()
        if line.startswith(("VmHWM", "VmRSS"))
    }
    return ProcUsage(cpu, kib.get("VmHWM", 0) / 1024, kib.get("VmRSS", 0) / 1024)


def usages(pids: dict[int, str]) -> dict[int, ProcUsage]:
    """The usage of each process still running."""
    return {pid: u for pid in pids if (u := proc_usage(pid)) is not None}


def servers() -> dict[int, str]:
    """Local RabbitMQ and PostgreSQL processes (none when they run elsewhere)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            comm = (entry / "comm").read_text().strip()
        except OSError:
            continue
        if comm in SERVERS:
            found[int(entry.name)] = SERVERS[comm]
    return found


def children(pid: int) -> dict[int, str]:
    """The child processes of `pid` and their command lines (empty where /proc cannot tell)."""
    try:
        pids = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return {}
    found = {}
    for child in map(int, pids):
        try:
            found[child] = Path(f"/proc/{child}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
    return found


@dataclass(frozen=True)
class MachineUsage:
    """The whole machine since boot, from /proc/stat."""

    busy_s: float
    total_s: float
    context_switches: int

    def __sub__(self, other: MachineUsage) -> MachineUsage:
        return MachineUsage(
            self.busy_s - other.busy_s,
            self.total_s - other.total_s,
            self.context_switches - other.context_switches,
        )


def machine_usage() -> MachineUsage:
    try:
        lines = Path("/proc/stat").read_text().splitlines()
        fields = [int(f) for f in lines[0].split()[1:]]
        switches = next((int(line.split()[1]) for line in lines if line.startswith("ctxt ")), 0)
    except (OSError, ValueError, IndexError):
        return MachineUsage(0.0, 0.0, 0)
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    total = sum(fields[:8])  # user nice system idle iowait irq softirq steal
    return MachineUsage((total - idle) / CLOCK_TICKS, total / CLOCK_TICKS, switches)
