"""docker-compose.yml cannot run here (no Docker engine): check it statically instead."""

from __future__ import annotations

from pathlib import Path

import click
import yaml

from services.cli.main import main
from shared.config import Settings

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
SETTINGS = {f"ORDERFLOW_{name.upper()}" for name in Settings.model_fields}


def orderflow_services() -> dict[str, dict]:
    return {name: svc for name, svc in COMPOSE["services"].items() if "command" in svc}


def resolves(args: list[str]) -> bool:
    """True when `orderflow <args>` names a real command with valid arguments."""
    ctx = click.Context(main)
    command: click.Command = main
    rest = list(args)
    while isinstance(command, click.Group) and rest:
        sub = command.get_command(ctx, rest[0])
        if sub is None:
            return False
        command, rest = sub, rest[1:]
    try:
        command.make_context("orderflow", rest, parent=ctx)
    except click.ClickException:
        return False
    return True


def test_every_service_runs_a_real_orderflow_command() -> None:
    services = orderflow_services()
    assert {
        "init",
        "remote",
        "submission",
        "scheduler",
        "supervisor",
        "agent-inventory",
        "agent-payment",
        "agent-shipping",
    } <= set(services)
    for name, svc in services.items():
        assert resolves(svc["command"]), f"{name}: orderflow {' '.join(svc['command'])}"


def test_the_static_check_can_fail() -> None:
    assert not resolves(["serve", "nonsense"])
    assert not resolves(["serve", "agent", "billing"])


def test_every_variable_a_service_sets_is_a_real_setting() -> None:
    for name, svc in orderflow_services().items():
        unknown = set(svc.get("environment", {})) - SETTINGS
        assert not unknown, f"{name} sets {unknown}"


def test_every_image_is_pinned() -> None:
    for name, svc in COMPOSE["services"].items():
        image = svc.get("image", "")
        assert ":" in image and not image.endswith(":latest"), f"{name}: {image!r}"
