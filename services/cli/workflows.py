"""`orderflow workflows`: which workflow versions this build runs and which ones orders still use
(the reports: `services/operator/workflows.py`)."""

from __future__ import annotations

from dataclasses import asdict

import click
from rich.table import Table

from services.cli.operations import run_operations
from services.cli.render import add_columns, echo_json, plain_console, shown
from services.cli.settings import pass_settings
from services.operator.workflows import VersionReport
from shared.config import Settings


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@pass_settings()
def workflows(settings: Settings, as_json: bool) -> None:
    """Workflow versions: registered, current, and the orders still using each.

    Exits 1 when orders use a version this build does not have."""
    reports = run_operations(settings, lambda ops: ops.workflows())
    if as_json:
        rows = [asdict(r) | {"retirable": r.retirable, "verdict": r.verdict} for r in reports]
        echo_json({"versions": rows})
    else:
        _print(reports)
    if any(not r.registered for r in reports):
        raise SystemExit(1)  # orders on a version this build cannot run: an operator must act


def _print(reports: list[VersionReport]) -> None:
    table = Table(title="workflow versions")
    add_columns(table, "workflow", "version", "steps", "active", "finished", "verdict")
    for r in reports:
        table.add_row(
            shown(r.workflow),
            f"v{r.version}",
            shown(" > ".join(r.steps) or "?"),
            str(r.active),
            str(r.finished),
            shown(r.verdict),
        )
    plain_console().print(table)
