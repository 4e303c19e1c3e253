"""The API's resident memory under large request bodies sent without a token (issue 33).

    python -m tests.bench.api_memory [--clients 20] [--mib 100] [--chunked]

It starts `orderflow serve api` alone in a hub of its own on the local RabbitMQ and PostgreSQL
(as the system tests do), sends `--clients` concurrent `POST /orders` of `--mib` MiB each (one
JSON string; `--chunked`: without a length, ended after `--mib` MiB only if the API reads that
far) with no token, and prints the API process's resident memory (`/proc/<pid>/status`): VmRSS
before, the highest VmRSS sampled every 20 ms and VmHWM (the kernel's peak) during, VmRSS
after, and what each client was answered. The API is killed if it passes `--guard-mib`, so that
a build without a body limit cannot take the machine's memory.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import tempfile
import uuid
from collections import Counter
from pathlib import Path

from tests.support.api import start_api
from tests.support.raw_http import MIB, memory_kib, upload
from tests.support.topology import running_topology


async def _watch(pid: int, peak: list[int], guard_kib: int, stop: asyncio.Event) -> None:
    while not stop.is_set():
        rss = memory_kib(pid)["VmRSS"]
        peak[0] = max(peak[0], rss)
        if rss > guard_kib:
            print(f"VmRSS {rss // 1024} MiB passed the guard: killing the API")
            os.kill(pid, signal.SIGKILL)
            return
        await asyncio.sleep(0.02)


async def main(clients: int, mib: int, chunked: bool, guard_mib: int) -> None:
    hub = f"t{uuid.uuid4().hex[:12]}"
    with tempfile.TemporaryDirectory() as folder:
        async with running_topology(hub, Path(folder)) as topo:
            api = await start_api(topo)
            await api.close()
            pid = topo.procs["api"].pid
            port = int(api.base.rsplit(":", 1)[1])
            before = memory_kib(pid)
            peak, stop = [before["VmRSS"]], asyncio.Event()
            watcher = asyncio.create_task(_watch(pid, peak, guard_mib * 1024, stop))
            size = None if chunked else mib * MIB
            answers = await asyncio.gather(
                *(
                    upload(port, "/orders", size=size, give_up_after=mib * MIB, timeout=120)
                    for _ in range(clients)
                ),
                return_exceptions=True,
            )
            during = memory_kib(pid)
            stop.set()
            await watcher
            await asyncio.sleep(1)
            after = memory_kib(pid)
    body = "chunked, no length" if chunked else "with Content-Length"
    print(f"{clients} concurrent POST /orders of {mib} MiB ({body}), no token:")
    print(f"  VmRSS before      {before['VmRSS'] / 1024:8.1f} MiB")
    print(f"  VmRSS peak sample {peak[0] / 1024:8.1f} MiB")
    print(f"  VmHWM             {during['VmHWM'] / 1024:8.1f} MiB")
    print(f"  VmRSS after       {after['VmRSS'] / 1024:8.1f} MiB")
    outcomes = Counter(
        repr(a) if isinstance(a, BaseException) else f"{a.status} after {a.sent // MIB} MiB sent"
        for a in answers
    )
    for outcome, count in sorted(outcomes.items()):
        print(f"  {count} x {outcome}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--mib", type=int, default=100)
    parser.add_argument("--chunked", action="store_true")
    parser.add_argument("--guard-mib", type=int, default=8192)
    args = parser.parse_args()
    asyncio.run(main(args.clients, args.mib, args.chunked, args.guard_mib))
