"""How a command gets its settings: one way, `@pass_settings`.

The `orderflow` group reads the environment once, before any command runs, with its own
options (`--hub`, `--store-url`, `--rabbitmq-url`) in place of the settings they name, so that a
bad value fails every command alike (exit 2, one line). A command takes the result as its first
argument through `@pass_settings()`. A command whose own options override settings names them,
`@pass_settings("store_url")`: each such option is named as the setting it overrides, and a
value given is read in its place and validated like the environment's (the option itself is not
passed on).

One command reads a setting another way, on purpose: `orderflow health`, the container
healthcheck run as `python -m services.cli.health` every few seconds, takes its port from
ORDERFLOW_METRICS_PORT as click reads an option's environment variable, so that it starts in tens
of milliseconds (importing the settings alone takes about 0.2 s here).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import click

from shared.config import Settings, load_settings
from shared.errors import ConfigurationError

R = TypeVar("R")


@dataclass(frozen=True)
class LoadedSettings:
    """The group's context object: the settings read once, and the group's overrides."""

    settings: Settings
    overrides: dict[str, object] = field(default_factory=dict)

    @classmethod
    def load(cls, **overrides: object) -> LoadedSettings:
        given = {name: value for name, value in overrides.items() if value is not None}
        return cls(load_settings(**given), given)

    def with_overrides(self, **overrides: object) -> Settings:
        """The settings with a command's overrides given (None: not given) in place; read
        again, and so validated, only when there are some."""
        given = {name: value for name, value in overrides.items() if value is not None}
        if not given:
            return self.settings
        return load_settings(**(self.overrides | given))


def pass_settings(*overriding: str) -> Callable[[Callable[..., R]], Callable[..., R]]:
    """Call the command with its settings as the first argument, the options named in
    `overriding` (each named as a setting) in place of the settings they name."""

    def decorate(command: Callable[..., R]) -> Callable[..., R]:
        @functools.wraps(command)
        def with_settings(*args: Any, **kwargs: Any) -> R:
            loaded = click.get_current_context().find_object(LoadedSettings)
            if loaded is None:  # pragma: no cover - the `orderflow` group always loads them
                raise ConfigurationError("settings were not loaded")
            changes = {name: kwargs.pop(name) for name in overriding}
            return command(loaded.with_overrides(**changes), *args, **kwargs)

        return with_settings

    return decorate


def settings_of(ctx: click.Context) -> Settings | None:
    """The settings the group read, for what runs after a command failed (its error's words);
    None when they could not be read."""
    loaded = ctx.find_object(LoadedSettings)
    return loaded.settings if loaded is not None else None
