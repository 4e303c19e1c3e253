"""The `orderflow` command: every process and every operator action starts here."""

from __future__ import annotations

import importlib
import logging
import os
import sys
from collections.abc import Mapping
from importlib.metadata import version
from typing import Any

import click

from services.cli.render import PlainFormatter, plain
from services.cli.settings import LoadedSettings, settings_of
from services.cli.uninitialised import not_initialised
from shared.config import FIELDS
from shared.errors import ConfigurationError, OrderflowError, ServiceUnavailable, one_line
from shared.masking import mask_credentials

EXIT_FAILURE = 1
EXIT_CONFIGURATION = 2
EXIT_UNAVAILABLE = 3


COMMANDS: dict[str, tuple[str, str]] = {
    "alerts": ("services.cli.inspect", "alerts"),
    "audit": ("services.cli.inspect", "audit"),
    "bench": ("services.cli.bench", "bench"),
    "deploy": ("services.cli.deploy", "deploy"),
    "dlq": ("services.cli.dlq", "dlq"),
    "health": ("services.cli.health", "health"),
    "init": ("services.cli.init", "init"),
    "nemesis": ("services.cli.nemesis", "nemesis"),
    "orders": ("services.cli.order_actions", "orders"),  # the group, with its actions
    "remote": ("services.cli.remote", "remote"),
    "serve": ("services.cli.serve", "serve"),
    "simulate": ("services.cli.simulate", "simulate"),
    "snapshot": ("services.cli.snapshot", "snapshot"),
    "stats": ("services.cli.inspect", "stats"),
    "submit": ("services.cli.submit", "submit"),
    "tokens": ("services.cli.tokens", "tokens"),
    "up": ("services.cli.up", "up"),
    "watch": ("services.cli.inspect", "watch"),
    "workflows": ("services.cli.workflows", "workflows"),
}
"""Every command: its module and name. A command's module is imported only when it runs (or
`--help` lists it): `orderflow serve scheduler` does not load the web API, the bench or the
deployment generators, and every process and one-shot command starts faster for it."""


class OrderflowGroup(click.Group):
    """Turns orderflow's errors into one line on stderr and an exit code, never a traceback;
    loads each command's module when it is asked for (`COMMANDS`)."""

    def __init__(
        self, *args: Any, lazy: Mapping[str, tuple[str, str]] | None = None, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self._lazy = dict(lazy or {})

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*self.commands, *self._lazy})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in self.commands or cmd_name not in self._lazy:
            return self.commands.get(cmd_name)
        module, name = self._lazy[cmd_name]
        command = getattr(importlib.import_module(module), name)
        assert isinstance(command, click.Command), (module, name)
        return command

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except ConfigurationError as exc:
            _fail(f"configuration: {exc}", EXIT_CONFIGURATION)
        except ServiceUnavailable as exc:
            _fail(str(exc) + _store_hint(ctx, exc), EXIT_UNAVAILABLE)
        except OrderflowError as exc:
            _fail(not_initialised(ctx, exc) or one_line(exc), EXIT_FAILURE)
        except (click.exceptions.Exit, click.ClickException, click.Abort, SystemExit):
            raise
        except Exception as exc:
            if os.environ.get("ORDERFLOW_DEBUG") == "1":
                raise
            uninitialised = not_initialised(ctx, exc)
            if uninitialised is not None:
                _fail(uninitialised, EXIT_FAILURE)
            _fail(
                f"unexpected {type(exc).__name__}: {one_line(exc)} "
                "(set ORDERFLOW_DEBUG=1 for a traceback)",
                EXIT_FAILURE,
            )


def _fail(message: str, code: int) -> None:
    # An error may quote data (a remote service's answer, a server's message): escaped; and
    # a URL (a library's message may quote one): its credentials masked.
    click.echo(f"orderflow: error: {plain(mask_credentials(message))}", err=True)
    sys.exit(code)


def _store_hint(ctx: click.Context, exc: ServiceUnavailable) -> str:
    """How to select PostgreSQL, when the store that is unreachable is MongoDB (the default)."""
    settings = settings_of(ctx)
    if settings is None or settings.store.store_kind != "mongodb" or "MongoDB" not in str(exc):
        return ""
    chosen = settings.store.store_url != FIELDS["store_url"].default
    why = "ORDERFLOW_STORE_URL selects MongoDB" if chosen else "MongoDB is the default store"
    return (
        f" ({why}; to use PostgreSQL instead set "
        "ORDERFLOW_STORE_URL=postgresql://HOST:5432/DATABASE, in the environment or .env)"
    )


@click.group(
    cls=OrderflowGroup, lazy=COMMANDS, context_settings={"help_option_names": ["-h", "--help"]}
)
@click.version_option(version("orderflow"), prog_name="orderflow")
@click.option("--hub", help="Task hub name (overrides ORDERFLOW_HUB).")
@click.option("--store-url", help="Store URL (overrides ORDERFLOW_STORE_URL).")
@click.option(
    "--rabbitmq-url",
    help="AMQP URL, or a comma-separated list of one cluster's nodes (overrides the setting).",
)
@click.pass_context
def main(
    ctx: click.Context, hub: str | None, store_url: str | None, rabbitmq_url: str | None
) -> None:
    """orderflow: resilient order processing (Scheduler-Agent-Supervisor).

    Settings come from ORDERFLOW_* environment variables and from the ORDERFLOW_* lines of
    `.env` in the current directory (or the file ORDERFLOW_ENV_FILE names; the environment
    wins); docs/reference/configuration.md lists every one.
    Exit codes: 0 ok, 1 failure, 2 bad configuration, 3 a server is unreachable.
    """
    # One-shot commands report failures as one line; library chatter would only repeat them.
    stderr = logging.StreamHandler()
    stderr.setFormatter(PlainFormatter("%(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=logging.WARNING, handlers=[stderr])
    for chatty in ("aio_pika", "aiormq"):
        logging.getLogger(chatty).setLevel(logging.CRITICAL)
    # Read once, here, so that a bad setting fails every command alike: `@pass_settings`.
    ctx.obj = LoadedSettings.load(hub=hub, store_url=store_url, rabbitmq_url=rabbitmq_url)
