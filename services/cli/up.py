"""`orderflow up`: the whole topology on one machine, as separate OS processes.

A local stand-in for docker-compose running the same commands: `orderflow serve …` per process,
their output prefixed with their names. Nothing is restarted on its own (a process that dies stays
dead, as a test of recovery may want); Ctrl-C or SIGTERM stops them all. With a metrics port N,
the processes get N, N+1, ... in the order they start (one Prometheus endpoint each).

The agents' account key and the schedulers' fence key for the remote service are the ones set,
or, when `up` runs the remote stand-in, made up for the run and given to it (`account_env`).
The stand-in's operator token and the shop's and the console's logins are made on the first
run in a directory and kept in a file beside `.env` for the next (services/cli/credentials.py),
which every `orderflow` command reads: `orderflow audit` works from the same directory as is.

Every port `up` would have its processes listen on (the remote stand-in's, the API's, the
metrics ports) is checked before anything starts: one in use is a one-line error. The children
die with `up`: each asks the kernel for SIGTERM when its parent dies (`PR_SET_PDEATHSIG`), so
that even a `kill -9` of `up` leaves no orphan (they drain and exit as on Ctrl-C).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import errno
import os
import secrets
import signal
import socket
import sys
from urllib.parse import urlsplit

import click

from services.cli.credentials import (
    OPERATOR_TOKEN,
    SHOP_TOKEN,
    keep_logins,
    local_credentials,
    logins_in,
)
from services.cli.operations import run_operations
from services.cli.render import plain
from services.cli.settings import pass_settings
from shared.bootstrap import initialise
from shared.config import Settings, credentials_file
from shared.domain.workflow import AGENTS
from shared.errors import ConfigurationError
from shared.masking import mask_credentials
from shared.remote.admin import TOKEN_VARIABLE
from shared.telemetry import chosen_format

GRACE_S = 5.0
"""Beyond the drain timeout, how long `up` waits before it kills a process that will not stop."""
MAX_PORT = 65535


def topology(
    schedulers: int, supervisors: int, agents: int, remote: bool, *, api: bool = False
) -> list[tuple[str, list[str]]]:
    procs: list[tuple[str, list[str]]] = []
    if remote:
        procs.append(("remote", ["serve", "remote"]))
    procs.append(("submission", ["serve", "submission"]))
    procs += [(f"scheduler-{i}", ["serve", "scheduler"]) for i in range(1, schedulers + 1)]
    procs += [(f"supervisor-{i}", ["serve", "supervisor"]) for i in range(1, supervisors + 1)]
    for name in AGENTS:
        procs += [(f"{name}-{i}", ["serve", "agent", name]) for i in range(1, agents + 1)]
    if api:
        procs.append(("api", ["serve", "api"]))
    return procs


def metrics_ports(procs: list[tuple[str, list[str]]], base: int) -> dict[str, int]:
    """Each process its own metrics port, `base` upwards in start order; all 0 (none) without."""
    if base and base + len(procs) - 1 > MAX_PORT:
        raise click.BadParameter(
            f"{len(procs)} processes need ports {base}..{base + len(procs) - 1}, beyond {MAX_PORT}",
            param_hint="--metrics-port",
        )
    return {label: base + i if base else 0 for i, (label, _) in enumerate(procs)}


PR_SET_PDEATHSIG = 1
"""prctl(2) option: the signal this process gets when its parent dies (Linux)."""


def die_with_parent(parent: int) -> None:
    """Run in each child between fork and exec: SIGTERM it when `up` dies, however `up` dies
    (the kernel sends it, so SIGKILL included). If `up` died before this ran, exit now."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:  # pragma: no cover
        os._exit(1)  # not Linux: better no child than an orphan
    if os.getppid() != parent:
        os._exit(1)


def listening_ports(
    settings: Settings, procs: list[tuple[str, list[str]]], ports: dict[str, int]
) -> list[tuple[str, int, str]]:
    """(host, port, what sets it) for every port the processes of `procs` would listen on."""
    labels = {label for label, _ in procs}
    wanted: list[tuple[str, int, str]] = []
    if "remote" in labels:
        from harness.remote.serve import remote_port  # noqa: PLC0415 - a harness, run by `up` only

        host = urlsplit(settings.remote.remote_url).hostname or "127.0.0.1"
        wanted.append((host, remote_port(settings), "the remote service, ORDERFLOW_REMOTE_PORT"))
    if "api" in labels:
        wanted.append((settings.api.api_host, settings.api.api_port, "the API, ORDERFLOW_API_PORT"))
    for label, port in ports.items():
        if port:
            wanted.append(
                (settings.observability.metrics_host, port, f"{label}'s metrics, --metrics-port")
            )
    return wanted


def check_ports_free(wanted: list[tuple[str, int, str]]) -> None:
    """A `ConfigurationError` naming the first port in use, before anything is started."""
    for host, port, what in wanted:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
            # As the servers bind: a port that only lingers in TIME_WAIT is free for them.
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind((host, port))
            except OSError as exc:
                why = "in use" if exc.errno == errno.EADDRINUSE else (exc.strerror or str(exc))
                raise ConfigurationError(
                    f"port {port} on {host} ({what}) is {why}: stop what holds it or choose "
                    "another port; nothing was started"
                ) from None


def children_env(settings: Settings, remote: bool) -> dict[str, str]:
    """What every child is told (the group's options and `.env` are read by `up` alone)."""
    remote_url = settings.remote.remote_url
    if remote:
        from harness.remote.serve import remote_port  # noqa: PLC0415 - a harness, run by `up` only

        # The agents call the stand-in `up` runs, wherever ORDERFLOW_REMOTE_PORT puts it.
        parts = urlsplit(remote_url)
        host = parts.hostname or "127.0.0.1"
        remote_url = parts._replace(netloc=f"{host}:{remote_port(settings)}").geturl()
    return {
        "ORDERFLOW_HUB": settings.hub,
        "ORDERFLOW_STORE_URL": settings.store.store_url,
        "ORDERFLOW_RABBITMQ_URL": settings.broker.rabbitmq_url,
        "ORDERFLOW_REMOTE_URL": remote_url,
        # Their output is a pipe to `up`: they log as suits where `up` writes it.
        "ORDERFLOW_LOG_FORMAT": chosen_format(settings.observability.log_format, sys.stdout),
    }


def account_env(settings: Settings, remote: bool) -> dict[str, str]:
    """The hub's keys at the remote service: the agents' account key and the schedulers' fence
    key (harness/remote/accounts.py) as set, else, when `up` runs the remote stand-in, made
    up for this run, with the stand-in's table of accounts holding the hub's entry (unless
    `ORDERFLOW_REMOTE_ACCOUNTS` is set). Against a remote service of its own (`--no-remote`),
    only what is set: keys made up here would match nothing there."""
    keys = {
        "ORDERFLOW_REMOTE_ACCOUNT_KEY": settings.remote.remote_account_key,
        "ORDERFLOW_REMOTE_FENCE_KEY": settings.remote.remote_fence_key,
    }
    env = {name: key.get_secret_value() for name, key in keys.items() if key is not None}
    if not remote:
        return env
    for name in keys:
        env.setdefault(name, secrets.token_hex(32))
    if not os.environ.get("ORDERFLOW_REMOTE_ACCOUNTS"):
        account_key, fence_key = (
            env["ORDERFLOW_REMOTE_ACCOUNT_KEY"],
            env["ORDERFLOW_REMOTE_FENCE_KEY"],
        )
        env["ORDERFLOW_REMOTE_ACCOUNTS"] = f"{settings.hub}:{account_key}:{fence_key}"
    return env


async def _pump(label: str, stream: asyncio.StreamReader | None, width: int) -> None:
    if stream is None:
        return
    while True:
        try:
            line = await stream.readline()
        except ValueError:
            # A line longer than the reader's limit: asyncio drops it and reading goes on (if
            # this pump stopped instead, the child would block on a full pipe for good).
            line = b"(a line longer than 64 KiB left out)\n"
        if not line:
            return
        # A child's output is data too (a library's warning may quote anything): escaped.
        text = plain(mask_credentials(line.decode(errors="replace").removesuffix("\n")))
        sys.stdout.write(f"{label:<{width}} | {text}\n")
        sys.stdout.flush()


async def run_up(
    settings: Settings,
    procs: list[tuple[str, list[str]]],
    ports: dict[str, int] | None = None,
    *,
    remote_env: dict[str, str] | None = None,
) -> int:
    """Run `procs` until SIGTERM/SIGINT or until all have exited; `remote_env` is for the remote
    stand-in alone (its operator token: no other process needs it)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    remote = any(label == "remote" for label, _ in procs)
    env = os.environ | children_env(settings, remote) | account_env(settings, remote)
    parent = os.getpid()
    width = max(len(label) for label, _ in procs)
    children: dict[str, asyncio.subprocess.Process] = {}
    pumps = []
    for label, args in procs:
        # Every child gets its own port, or none: never the one port they would all inherit.
        port = (ports or {}).get(label, 0)
        own = (remote_env or {}) if label == "remote" else {}
        child = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "services.cli",
            *args,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            env=env | own | {"ORDERFLOW_METRICS_PORT": str(port)},
            preexec_fn=lambda: die_with_parent(parent),
        )
        children[label] = child
        pumps.append(asyncio.create_task(_pump(label, child.stdout, width)))
        metrics = f", metrics on port {port}" if port else ""
        click.echo(f"{'up':<{width}} | started {label} (pid {child.pid}){metrics}")
    watchers = [asyncio.create_task(_watch(label, c, width, stop)) for label, c in children.items()]
    stopping = asyncio.create_task(stop.wait())
    all_exited = asyncio.create_task(_all(watchers))
    # Run until told to stop, or until every process has exited on its own.
    await asyncio.wait([stopping, all_exited], return_when=asyncio.FIRST_COMPLETED)
    alive = sum(c.returncode is None for c in children.values())
    click.echo(f"{'up':<{width}} | stopping {alive} process(es)")
    await _stop_all(children, timeout=settings.process.drain_timeout_s + GRACE_S)
    stopping.cancel()
    all_exited.cancel()
    await asyncio.gather(*pumps, *watchers, return_exceptions=True)
    return 0 if stop.is_set() else 1


async def _all(tasks: list[asyncio.Task[None]]) -> bool:
    await asyncio.gather(*tasks)
    return True


async def _watch(
    label: str, child: asyncio.subprocess.Process, width: int, stop: asyncio.Event
) -> None:
    code = await child.wait()
    note = "" if stop.is_set() else " (not restarted)"
    click.echo(f"{'up':<{width}} | {label} exited with code {code}{note}")


async def _stop_all(children: dict[str, asyncio.subprocess.Process], *, timeout: float) -> None:
    for child in children.values():
        if child.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                child.send_signal(signal.SIGTERM)
    waits = [asyncio.create_task(c.wait()) for c in children.values()]
    _, late = await asyncio.wait(waits, timeout=timeout)
    if late:
        for child in children.values():
            if child.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    child.kill()
        await asyncio.gather(*late, return_exceptions=True)


@click.command()
@click.option(
    "--schedulers",
    default=1,
    show_default=True,
    type=click.IntRange(min=1),
    help="Scheduler processes.",
)
@click.option(
    "--supervisors",
    default=1,
    show_default=True,
    type=click.IntRange(min=1),
    help="Supervisor processes (one leads at a time; the others stand by).",
)
@click.option(
    "--agents",
    default=1,
    show_default=True,
    type=click.IntRange(min=1),
    help="Processes per agent kind.",
)
@click.option(
    "--remote/--no-remote",
    default=True,
    show_default=True,
    help="Run the simulated remote service too (off: use ORDERFLOW_REMOTE_URL's).",
)
@click.option(
    "--api/--no-api",
    default=True,
    show_default=True,
    help="Serve the HTTP API, the shop and the console on ORDERFLOW_API_PORT too.",
)
@click.option(
    "--metrics-port",
    type=click.IntRange(min=0, max=MAX_PORT),
    help="First metrics port: each process serves Prometheus metrics on its own port, this one "
    "upwards in start order [default: ORDERFLOW_METRICS_PORT; 0: no metrics endpoints].",
)
@pass_settings("metrics_port")
def up(
    settings: Settings, schedulers: int, supervisors: int, agents: int, remote: bool, api: bool
) -> None:
    """Initialise, then run the whole topology as separate processes until Ctrl-C/SIGTERM."""
    procs = topology(schedulers, supervisors, agents, remote, api=api)
    ports = metrics_ports(procs, settings.observability.metrics_port)
    check_ports_free(listening_ports(settings, procs, ports))
    report = asyncio.run(initialise(settings))
    click.echo(
        plain(f"up: hub {report.hub!r} on {report.store_kind}, RabbitMQ {report.broker_version}")
    )
    credentials = local_credentials(remote=remote, api=api)
    if remote:
        click.echo(
            mask_credentials(
                f"up: the remote stand-in at {children_env(settings, True)['ORDERFLOW_REMOTE_URL']}"
            )
        )
    if api:
        show_logins(settings, credentials)
    if remote or api:
        click.echo(
            plain(
                f"up: local credentials in {credentials_file()} (made on the first run here, "
                "read by every `orderflow` command run here, as .env is)"
            )
        )
    admin = {TOKEN_VARIABLE: credentials[TOKEN_VARIABLE]} if remote else {}
    code = asyncio.run(run_up(settings, procs, ports, remote_env=admin))
    sys.exit(code)


def show_logins(settings: Settings, credentials: dict[str, str]) -> None:
    """The shop's and the console's addresses and logins, once (after `up` made sure each
    login is a token of this hub's store)."""
    refused = run_operations(settings, lambda ops: keep_logins(ops.store, credentials))
    base = f"http://{settings.api.api_host}:{settings.api.api_port}"
    pages = {
        SHOP_TOKEN: ("the shop", f"{base}/"),
        OPERATOR_TOKEN: ("the console", f"{base}/console"),
    }
    for login in logins_in(credentials):
        what, url = pages[login.variable]
        if login in refused:
            click.echo(
                f"up: {what} at {url}: no login made, as another active token is named "
                f"{login.name!r}: `orderflow tokens revoke {login.name}`, then `orderflow up` "
                f"again (or `orderflow tokens create --role {login.role.value} --name N`)"
            )
        else:
            click.echo(
                f"up: {what} at {url}, token {credentials[login.variable]} "
                f"({login.role.value} {login.name!r})"
            )
    click.echo(
        f"up: the API's document at {base}/openapi.json (more tokens: `orderflow tokens create "
        "--role shop|viewer|operator --name N`)"
    )
