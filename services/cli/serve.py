"""`orderflow serve <kind>`: run one process of the topology until SIGTERM or Ctrl-C."""

from __future__ import annotations

import asyncio
import functools
import gc
import logging
import os
import signal
import socket
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import click
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception_type,
    stop_after_delay,
    wait_exponential,
)

from services.agents.agent import serve_agent
from services.cli.settings import pass_settings
from services.scheduler.service import serve_scheduler
from services.submission.service import serve_submission
from services.supervisor.service import serve_supervisor
from shared.bootstrap import Runtime, arm_crash_drill
from shared.config import Settings
from shared.domain.workflow import AGENTS
from shared.errors import ServiceUnavailable
from shared.telemetry import configure_logging
from shared.tracing import configure_tracing, shutdown_tracing

log = logging.getLogger(__name__)

Service = Callable[[Runtime, asyncio.Event], Awaitable[None]]
STARTUP_TIMEOUT_S = 60.0


GC_YOUNG_THRESHOLD = 10_000
"""Net container allocations between young-generation collections (CPython's default: 700)."""


def tune_gc() -> None:
    """Keep the cyclic garbage collector off a serving process's hot path. Refcounting frees
    almost everything an order allocates, but at CPython's default threshold the orders in
    flight kept crossing it: measured, collections took a tenth of a scheduler's CPU, most
    of it rescanning the ~78,000 objects that imports and set-up leave behind. Those are moved
    to the permanent generation (`gc.freeze`), and young collections wait for 10,000 net
    allocations; real cycles are still collected, in larger batches."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(GC_YOUNG_THRESHOLD)


def run_loop(main: Coroutine[Any, Any, None]) -> None:
    """Run a serving process's event loop: uvloop where it is installed (the default
    dependency on Linux; about a tenth less CPU per order), asyncio's own loop otherwise."""
    tune_gc()
    try:
        import uvloop  # noqa: PLC0415 - optional: only where it is installed
    except ImportError:  # pragma: no cover - uvloop is a dependency where it builds
        asyncio.run(main)
        return
    uvloop.run(main)


def process_name(kind: str, name: str | None) -> str:
    return name or f"{kind}-{socket.gethostname()}-{os.getpid()}"


def _stop_on_signals(stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)


def _log_retry(state: RetryCallState) -> None:
    error = state.outcome.exception() if state.outcome is not None else None
    log.warning("servers not reachable yet; retrying", extra={"error": str(error)})


async def _connect(settings: Settings, name: str, stop: asyncio.Event) -> Runtime:
    """Servers may still be starting (or restarting): retry with backoff, bounded."""
    async for attempt in AsyncRetrying(
        stop=stop_after_delay(STARTUP_TIMEOUT_S),
        wait=wait_exponential(multiplier=0.2, max=5),
        retry=retry_if_exception_type(ServiceUnavailable),
        reraise=True,
        before_sleep=_log_retry,
    ):
        with attempt:
            return await Runtime.open(settings, name)
    raise AssertionError("unreachable")  # pragma: no cover


async def _run(settings: Settings, kind: str, name: str, service: Service) -> None:
    stop = asyncio.Event()
    _stop_on_signals(stop)
    runtime = await _connect(settings, name, stop)
    try:
        await service(runtime, stop)
    finally:
        await runtime.close()
        shutdown_tracing()  # what is buffered is exported before the process ends
        log.info("stopped", extra={"kind": kind})


def traced(settings: Settings, kind: str, name: str) -> None:
    """Export this process's spans where the settings say (shared/tracing.py); off by default."""
    configure_tracing(
        hub=settings.hub,
        service=kind,
        instance=name,
        otlp_endpoint=settings.observability.otlp_endpoint,
        trace_file=settings.observability.trace_file,
        sample_ratio=settings.observability.trace_sample_ratio,
    )


def _serve(settings: Settings, kind: str, name: str | None, service: Service) -> None:
    pname = process_name(kind, name)
    configure_logging(
        level=settings.observability.log_level,
        process=pname,
        hub=settings.hub,
        log_format=settings.observability.log_format,
    )
    traced(settings, kind, pname)
    run_loop(_run(settings, kind, pname, service))


name_option = click.option("--name", help="Process name in logs, history and leases.")
burst_option = click.option(
    "--burst",
    is_flag=True,
    help="Run until there is nothing left to do (one round for a supervisor), then exit.",
)


@click.group()
def serve() -> None:
    """Run one orderflow process until SIGTERM or Ctrl-C (then drain and exit)."""


@serve.command()
@name_option
@burst_option
@pass_settings()
def submission(settings: Settings, name: str | None, burst: bool) -> None:
    """Record orders from <hub>.orders."""
    _serve(settings, "submission", name, functools.partial(serve_submission, burst=burst))


@serve.command()
@name_option
@burst_option
@pass_settings()
def scheduler(settings: Settings, name: str | None, burst: bool) -> None:
    """Claim orders and run their workflows."""
    arm_crash_drill(settings.drills)  # the scheduler process's drill, chosen at its bootstrap
    _serve(settings, "scheduler", name, functools.partial(serve_scheduler, burst=burst))


@serve.command()
@name_option
@burst_option
@pass_settings()
def supervisor(settings: Settings, name: str | None, burst: bool) -> None:
    """Recover attempts whose deadline passed (one leader at a time)."""
    _serve(settings, "supervisor", name, functools.partial(serve_supervisor, burst=burst))


@serve.command()
@click.argument("agent_name", type=click.Choice(AGENTS))
@name_option
@burst_option
@pass_settings()
def agent(settings: Settings, agent_name: str, name: str | None, burst: bool) -> None:
    """Run one agent: inventory, payment or shipping."""

    async def service(runtime: Runtime, stop: asyncio.Event) -> None:
        await serve_agent(agent_name, runtime, stop, burst=burst)

    _serve(settings, f"agent-{agent_name}", name, service)


@serve.command()
@name_option
@pass_settings()
def remote(settings: Settings, name: str | None) -> None:
    """Run the simulated remote service (inventory, payment, shipping) on ORDERFLOW_REMOTE_URL."""
    configure_logging(
        level=settings.observability.log_level,
        process=process_name("remote", name),
        hub=settings.hub,
        log_format=settings.observability.log_format,
    )

    from harness.remote.serve import serve_remote  # noqa: PLC0415 - a harness: this command's own

    async def run() -> None:
        stop = asyncio.Event()
        _stop_on_signals(stop)
        await serve_remote(settings, stop)

    run_loop(run())


@serve.command()
@name_option
@pass_settings()
def api(settings: Settings, name: str | None) -> None:
    """Serve the HTTP API, the shop and the operator console on ORDERFLOW_API_PORT."""
    from services.api.app import serve_api  # noqa: PLC0415 - only this command needs FastAPI

    _serve(settings, "api", name, serve_api)


@serve.command()
@name_option
@burst_option
@pass_settings()
def notifier(settings: Settings, name: str | None, burst: bool) -> None:
    """Deliver alerts (and their acknowledgements and resolutions) to the configured webhooks."""
    from services.notifier.service import (  # noqa: PLC0415 - only this command needs them
        required_targets,
        serve_notifier,
    )

    required_targets(settings.notifier)  # a configuration error before any server is asked
    _serve(settings, "notifier", name, functools.partial(serve_notifier, burst=burst))
