"""How a command gets its settings: one way, `services/cli/settings.pass_settings`."""

from __future__ import annotations

import re
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from services.cli.main import COMMANDS, main
from services.cli.settings import LoadedSettings, pass_settings
from shared.config import Settings
from shared.errors import ConfigurationError

CLI = Path(__file__).resolve().parents[2] / "services" / "cli"


def group_with(command: click.Command) -> click.Group:
    @click.group()
    @click.option("--hub")
    @click.pass_context
    def group(ctx: click.Context, hub: str | None) -> None:
        ctx.obj = LoadedSettings.load(hub=hub)

    group.add_command(command)
    return group


def test_a_command_gets_the_settings_the_group_read_with_its_own_overrides_in_place() -> None:
    seen: list[Settings] = []

    @click.command()
    @click.option("--store-url")
    @click.option("--n", type=int, default=1)
    @pass_settings("store_url")
    def show(settings: Settings, n: int) -> None:
        seen.append(settings)
        click.echo(f"{settings.hub} {settings.store.store_url} {n}")

    runner = CliRunner()
    env = {"ORDERFLOW_STORE_URL": "mongodb://env:27017"}
    plain = runner.invoke(group_with(show), ["--hub", "h1", "show", "--n", "2"], env=env)
    assert plain.output == "h1 mongodb://env:27017 2\n", plain.output
    given = ["--hub", "h1", "show", "--store-url", "postgresql://x/db"]
    overridden = runner.invoke(group_with(show), given, env=env)
    assert overridden.output == "h1 postgresql://x/db 1\n", overridden.output
    bad = runner.invoke(group_with(show), ["show", "--store-url", "ftp://x"], env=env)
    assert isinstance(bad.exception, ConfigurationError)
    assert str(bad.exception).startswith("ORDERFLOW_STORE_URL: ")


def test_without_overrides_the_settings_are_the_ones_read_once() -> None:
    loaded = LoadedSettings.load(hub="h2")
    assert loaded.with_overrides(store_url=None) is loaded.settings
    assert loaded.with_overrides(metrics_port=9100).hub == "h2"
    with pytest.raises(ConfigurationError, match="ORDERFLOW_METRICS_PORT"):
        loaded.with_overrides(metrics_port=70_000)


def test_no_command_reads_settings_another_way() -> None:
    """The old ways: `ctx.find_object(Settings)` in each command, a helper per module."""
    for path in CLI.glob("*.py"):
        if path.name == "settings.py":
            continue
        text = path.read_text()
        assert "find_object" not in text, path.name
        assert not re.search(r"\bload_settings\b|\bSettings\(", text), path.name


def test_every_command_of_the_lazy_group_loads_under_its_own_name() -> None:
    """`orderflow` imports a command's module only when the command runs: a wrong entry in
    `COMMANDS` would show only then. Each one loads here, and is the command it names."""
    ctx = click.Context(main)
    assert main.list_commands(ctx) == sorted(COMMANDS)
    for name in COMMANDS:
        command = main.get_command(ctx, name)
        assert isinstance(command, click.Command) and command.name == name, name
    assert main.get_command(ctx, "nonsense") is None
