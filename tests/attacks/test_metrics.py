"""Metrics and health endpoints listen on the loopback only (issue 33, item 12): every process
kind, started with a metrics port and no `ORDERFLOW_METRICS_HOST`, binds its endpoint to
127.0.0.1, as the kernel's own table of listening sockets shows, and a caller from the network
(this machine's non-loopback address) is refused. The compose deployment sets 0.0.0.0 inside its
containers, where Prometheus scrapes them over the monitoring network (tests/unit/test_compose.py).
"""

from __future__ import annotations

import socket
from pathlib import Path

import aiohttp
import pytest

from shared.domain.workflow import AGENTS
from tests.support.topology import free_port, running_topology
from tests.support.waiting import eventually

pytestmark = [pytest.mark.rabbitmq, pytest.mark.postgres]

KINDS = [
    ("remote", ["remote"]),
    ("submission", ["submission"]),
    ("scheduler", ["scheduler"]),
    ("supervisor", ["supervisor"]),
    *((agent, ["agent", agent]) for agent in AGENTS),
    ("api", ["api"]),
    ("notifier", ["notifier"]),
]
"""Every kind of process that serves metrics (`orderflow serve …`)."""


def listening(port: int) -> set[str]:
    """The addresses a TCP socket listens on at `port`, from /proc/net/tcp and tcp6."""
    found = set()
    for table, width in (("/proc/net/tcp", 8), ("/proc/net/tcp6", 32)):
        with open(table) as rows:
            next(rows)
            for row in rows:
                local, _, state = row.split()[1:4]
                address, _, hex_port = local.partition(":")
                if state == "0A" and int(hex_port, 16) == port:
                    raw = bytes.fromhex(address)
                    # The kernel writes each 32-bit word in host (little-endian) order.
                    words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
                    family = socket.AF_INET if width == 8 else socket.AF_INET6
                    found.add(socket.inet_ntop(family, words))
    return found


def network_address() -> str | None:
    """This machine's address on its network (where a route goes), if it has one."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.255", 9))  # no packet is sent: it only picks the route
        except OSError:
            return None
        address = str(probe.getsockname()[0])
    return None if address.startswith("127.") else address


async def answers(port: int) -> bool:
    try:
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"http://127.0.0.1:{port}/metrics") as response,
        ):
            return response.status == 200
    except aiohttp.ClientError:
        return False


async def test_every_metrics_endpoint_listens_on_the_loopback_only(
    hub: str, tmp_path: Path
) -> None:
    async with running_topology(hub, tmp_path) as topo:
        assert "ORDERFLOW_METRICS_HOST" not in topo.env
        ports = {}
        for label, args in KINDS:
            ports[label] = free_port()
            env = {"ORDERFLOW_METRICS_PORT": str(ports[label])}
            if label == "api":
                env["ORDERFLOW_API_PORT"] = str(free_port())
            if label == "notifier":
                env["ORDERFLOW_NOTIFY_WEBHOOK_URL"] = "http://127.0.0.1:9/hook"
            topo.serve(label, *args, **env)
        for label, port in ports.items():
            await eventually(lambda p=port: answers(p), timeout=60, what=f"{label}'s metrics")

        bound = {label: listening(port) for label, port in ports.items()}
        assert bound == {label: {"127.0.0.1"} for label in ports}, bound

        address = network_address()
        if address is None:
            return  # no network address to try from: the table above says it all
        for port in ports.values():
            with socket.socket() as outsider, pytest.raises(ConnectionRefusedError):
                outsider.settimeout(5)
                outsider.connect((address, port))
