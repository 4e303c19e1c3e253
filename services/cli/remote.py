"""`orderflow remote`: the remote stand-in's fault knobs, for trying a failure by hand (the
tour's outage, a demonstration): shown, and the outage switched on or off (the other knobs
start from the `ORDERFLOW_REMOTE_*` settings, and `PUT /admin/faults` sets them). The stand-in
answers only its operator token (`ORDERFLOW_REMOTE_ADMIN_TOKEN`), as `orderflow audit` reads it."""

from __future__ import annotations

import asyncio
from typing import Any

import click

from services.cli.render import echo_json, plain
from services.cli.settings import pass_settings
from shared.config import Settings
from shared.remote.admin import admin_token
from shared.remote.client import RemoteClient


async def _faults(settings: Settings, **changes: Any) -> dict[str, Any]:
    client = RemoteClient.open(settings.remote.remote_url, admin_token=admin_token())
    try:
        return await (client.set_faults(**changes) if changes else client.faults())
    finally:
        await client.close()


def _show(faults: dict[str, Any], as_json: bool) -> None:
    if as_json:
        echo_json(faults)
        return
    for name, value in sorted(faults.items()):
        if isinstance(value, bool):
            shown: Any = "on" if value else "off"
        else:
            shown = ", ".join(value) if isinstance(value, list) else value
        click.echo(plain(f"{name}: {'' if shown is None else shown}"))


@click.group()
def remote() -> None:
    """The remote stand-in's fault knobs (the one `orderflow up` runs)."""


@remote.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@pass_settings()
def faults(settings: Settings, as_json: bool) -> None:
    """Show the stand-in's fault knobs as they are now."""
    _show(asyncio.run(_faults(settings)), as_json)


@remote.command()
@click.argument("switch", type=click.Choice(["on", "off"]))
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@pass_settings()
def outage(settings: Settings, switch: str, as_json: bool) -> None:
    """Switch an outage on (every call fails with 503, as a service that is down) or off."""
    _show(asyncio.run(_faults(settings, outage=switch == "on")), as_json)
