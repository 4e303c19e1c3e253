"""`orderflow snapshot`: the dashboard, queried from Prometheus, as one HTML file to keep
(services/operator/snapshot.py)."""

from __future__ import annotations

import asyncio
import sys
from datetime import UTC, datetime
from pathlib import Path

import click

from services.cli.settings import pass_settings
from services.operator.snapshot import query_panels, render
from shared.config import Settings
from shared.masking import mask_credentials

POINTS = 240
"""Points per series: a step of the range over this (at least 1 s)."""
UNTIL_FORMATS = [
    "%Y-%m-%dT%H:%M:%S.%f%z",
    "%Y-%m-%dT%H:%M:%S%z",
    "%Y-%m-%dT%H:%M%z",
    "%Y-%m-%dT%H:%M:%S.%f",
    "%Y-%m-%dT%H:%M:%S",
    "%Y-%m-%d %H:%M:%S",
    "%Y-%m-%dT%H:%M",
]
"""What `--until` takes: a log line's `at` as it is, or a time without offset, read as UTC."""


@click.command()
@click.option(
    "--prometheus",
    envvar="ORDERFLOW_PROMETHEUS_URL",
    default="http://127.0.0.1:9090",
    show_default=True,
    help="Prometheus's URL (the observability profile publishes it on 127.0.0.1:9090).",
)
@click.option(
    "--minutes",
    type=click.FloatRange(min=0.25, max=31 * 24 * 60),
    default=30.0,
    show_default=True,
    help="How far back the snapshot reaches.",
)
@click.option(
    "--until",
    type=click.DateTime(formats=UNTIL_FORMATS),
    help="Where it ends [default: now]: an incident's time, looked at afterwards. With an "
    "offset (as the log lines' `at`, 2026-12-04T03:10:00.123+00:00), or else in UTC.",
)
@click.option(
    "--out",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write the page here [default: standard output].",
)
@pass_settings()
def snapshot(
    settings: Settings, /, prometheus: str, minutes: float, until: datetime | None, out: Path | None
) -> None:
    """The dashboard's panels over the last MINUTES, as one self-contained HTML page (no
    script; nothing is fetched when it is opened): to attach to an incident report, or to keep
    after Prometheus's retention dropped the data."""
    if out is not None and not out.parent.is_dir():
        raise click.BadParameter(f"{out.parent} is not a directory", param_hint="'--out'")
    if until is None:
        until = datetime.now(UTC)
    elif until.tzinfo is None:
        until = until.replace(tzinfo=UTC)
    end = until.timestamp()
    start = end - minutes * 60
    step = max(1.0, (end - start) / POINTS)
    drawn = asyncio.run(query_panels(prometheus, start=start, end=end, step=step))
    page = render(drawn, start=start, end=end, step=step, title=f"orderflow: hub {settings.hub}")
    if out is None:
        sys.stdout.write(page)
    else:
        out.write_text(page, encoding="utf-8")
    empty = [d.panel.title for d in drawn if not any(s.points for s in d.series)]
    click.echo(
        f"wrote {out or 'the page to standard output'}: {len(drawn)} panels from "
        f"{mask_credentials(prometheus)}, "
        + (f"{len(empty)} with no data: {'; '.join(empty)}" if empty else "each with data"),
        err=True,
    )
    for panel in drawn:
        for error in panel.errors:
            click.echo(f"{panel.panel.title}: Prometheus refused {error}", err=True)
        for note in panel.notes:
            click.echo(f"{panel.panel.title}: Prometheus warned {note}", err=True)
