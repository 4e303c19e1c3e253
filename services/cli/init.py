"""`orderflow init`: create the store's schema and indexes and declare the hub's queues."""

from __future__ import annotations

import asyncio

import click

from services.cli.render import plain
from services.cli.settings import pass_settings
from services.operator.initialise import initialise_when_up
from shared.config import Settings


@click.command()
@click.option(
    "--wait",
    "wait_s",
    type=click.FloatRange(min=0),
    default=0.0,
    show_default=True,
    help="Retry for up to this many seconds while a server is unreachable.",
)
@pass_settings()
def init(settings: Settings, wait_s: float) -> None:
    """Create the store's schema and indexes and declare the hub's queues. Idempotent."""
    report = asyncio.run(initialise_when_up(settings, wait_s))
    kind = "quorum" if report.quorum else "classic"
    click.echo(f"store: {report.store_kind}, hub {report.hub!r}: schema and indexes ready")
    click.echo(
        plain(f"broker: RabbitMQ {report.broker_version}, {len(report.queues)} {kind} queues ready")
    )
    if report.retired_alerts:
        click.echo(
            f"deleted the unbounded queue of an older release, {report.hub}.alerts, with "
            f"{report.retired_alerts} notifications (every alert stays stored: `orderflow alerts "
            f"list`; they now go to {report.hub}.alerts.feed)"
        )
