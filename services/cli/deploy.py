"""`orderflow deploy …`: the deployment files generated from the code.

`write` regenerates every committed one (after a setting, a queue or an index changed), the
documentation's reference pages too (docs/reference/: after a setting, a command or an option,
or an endpoint changed); `write --check` only reports the stale ones, as the unit tests do.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from deployment.envfile import compose_settings, env_example
from deployment.files import generated_files
from deployment.mongodb import init_script
from deployment.rabbitmq import DEFAULT_APPS, BrokerLimits, definitions, render
from services.api.app import openapi_document
from services.cli.main import main
from services.cli.settings import pass_settings
from shared.broker.topology import APP_NAME
from shared.config import Settings

ROOT = Path(__file__).resolve().parents[2]


def _apps(_: click.Context, __: click.Parameter, apps: tuple[str, ...]) -> tuple[str, ...]:
    for app in apps:
        if not APP_NAME.fullmatch(app):
            raise click.BadParameter(f"{app!r} must match {APP_NAME.pattern}")
    return apps or DEFAULT_APPS


@click.group()
def deploy() -> None:
    """Generate deployment files (RabbitMQ definitions, MongoDB init, .env.example)."""


def _limit_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """One `--<limit> N` option per field of BrokerLimits, defaulting to the generator's."""
    for field in reversed(dataclasses.fields(BrokerLimits)):
        command = click.option(
            f"--{field.name.replace('_', '-')}",
            field.name,
            type=click.IntRange(min=1),
            default=field.default,
            show_default=True,
            help=f"Limit: {field.name.replace('_', ' ')}.",
        )(command)
    return command


@deploy.command("rabbitmq-definitions")
@click.option("--hub", help="Task hub [default: ORDERFLOW_HUB].")
@click.option("--vhost", help="RabbitMQ virtual host [default: the hub].")
@click.option(
    "--app",
    "apps",
    multiple=True,
    callback=_apps,
    help="A submitting application (repeatable) [default: shop].",
)
@click.option("--user-prefix", help="Prefix of the services' user names [default: '<hub>-'].")
@_limit_options
@pass_settings("hub")
def rabbitmq_definitions(
    settings: Settings,
    /,
    vhost: str | None,
    apps: tuple[str, ...],
    user_prefix: str | None,
    **limits: int,
) -> None:
    """Vhost, users and least-privilege permissions, with password placeholders
    (infra/rabbitmq/render-definitions.sh fills in hashes from the environment), and the
    vhost's and each user's connection, channel and queue limits."""
    the_hub = settings.hub
    try:
        document = definitions(
            the_hub,
            vhost or the_hub,
            apps=apps,
            user_prefix=user_prefix,
            limits=BrokerLimits(**limits),
        )
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    click.echo(render(document), nl=False)


@deploy.command("mongodb-init")
@click.option("--hub", help="Task hub, the database [default: ORDERFLOW_HUB].")
@pass_settings("hub")
def mongodb_init(settings: Settings) -> None:
    """The mongo image's init script: the application user and MongoStore's indexes."""
    click.echo(init_script(settings.hub), nl=False)


@deploy.command("env-example")
def env_example_cmd() -> None:
    """.env.example: every setting with its default and doc, and the deployment's passwords."""
    click.echo(env_example(), nl=False)


@deploy.command("compose-settings")
def compose_settings_cmd() -> None:
    """infra/compose/settings.yml: the settings each orderflow container takes from .env."""
    click.echo(compose_settings(), nl=False)


@deploy.command()
@click.option("--check", is_flag=True, help="Only report stale files (exit 1 if any).")
@click.option(
    "--root",
    type=click.Path(file_okay=False, path_type=Path),
    default=ROOT,
    show_default="the repository",
    help="Directory the files are written to (or checked in).",
)
def write(check: bool, root: Path) -> None:
    """Regenerate every committed deployment file (the compose deployment's hub: orderflow)
    and the documentation's reference pages (docs/reference/)."""
    stale = []
    for relative, content in generated_files(openapi_document(), main).items():
        path = root / relative
        if path.exists() and path.read_text() == content:
            continue
        stale.append(relative)
        if not check:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(content)
            click.echo(f"wrote {relative}")
    if check and stale:
        click.echo(f"stale: {', '.join(stale)} (run `orderflow deploy write`)", err=True)
        sys.exit(1)
    if not stale:
        click.echo("every deployment file is up to date")
