"""The `orderflow` command: every process and every operator action starts here."""

from __future__ import annotations

import logging
import os
import sys
from importlib.metadata import version
from typing import Any

import click

from services.cli.bench import bench
from services.cli.deploy import deploy
from services.cli.dlq import dlq
from services.cli.health import health
from services.cli.init import init
from services.cli.inspect import alerts, audit, stats, watch
from services.cli.nemesis import nemesis
from services.cli.order_actions import orders  # the group, with its actions registered
from services.cli.render import PlainFormatter, plain
from services.cli.serve import serve
from services.cli.settings import LoadedSettings, settings_of
from services.cli.simulate import simulate
from services.cli.snapshot import snapshot
from services.cli.submit import submit
from services.cli.tokens import tokens
from services.cli.uninitialised import not_initialised
from services.cli.up import up
from services.cli.workflows import workflows
from shared.config import Settings
from shared.errors import ConfigurationError, OrderflowError, ServiceUnavailable, one_line
from shared.masking import mask_credentials

EXIT_FAILURE = 1
EXIT_CONFIGURATION = 2
EXIT_UNAVAILABLE = 3


class OrderflowGroup(click.Group):
    """Turns orderflow's errors into one line on stderr and an exit code, never a traceback."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except ConfigurationError as exc:
            _fail(f"configuration: {exc}", EXIT_CONFIGURATION)
        except ServiceUnavailable as exc:
            _fail(str(exc) + _store_hint(ctx, exc), EXIT_UNAVAILABLE)
        except OrderflowError as exc:
            _fail(one_line(exc), EXIT_FAILURE)
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
    if settings is None or settings.store_kind != "mongodb" or "MongoDB" not in str(exc):
        return ""
    chosen = settings.store_url != Settings.model_fields["store_url"].default
    why = "ORDERFLOW_STORE_URL selects MongoDB" if chosen else "MongoDB is the default store"
    return (
        f" ({why}; to use PostgreSQL instead set "
        "ORDERFLOW_STORE_URL=postgresql://HOST:5432/DATABASE, in the environment or .env)"
    )


@click.group(cls=OrderflowGroup, context_settings={"help_option_names": ["-h", "--help"]})
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
    wins); see the README for every one.
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


# Every command, one line each (`orderflow --help` lists them in alphabetical order).
main.add_command(alerts)
main.add_command(audit)
main.add_command(bench)
main.add_command(deploy)
main.add_command(dlq)
main.add_command(health)
main.add_command(init)
main.add_command(nemesis)
main.add_command(orders)
main.add_command(serve)
main.add_command(simulate)
main.add_command(snapshot)
main.add_command(stats)
main.add_command(submit)
main.add_command(tokens)
main.add_command(up)
main.add_command(watch)
main.add_command(workflows)
