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


class IsoTime(click.ParamType[datetime]):
    """An ISO 8601 time as `datetime.fromisoformat` reads it: a log line's `at`, an alert's
    `activeAt` (nanoseconds and `Z` included), or a time without offset, read as UTC."""

    name = "TIME"

    def convert(
        self, value: object, param: click.Parameter | None, ctx: click.Context | None
    ) -> datetime:
        if isinstance(value, datetime):
            moment = value
        else:
            try:
                moment = datetime.fromisoformat(str(value))
            except ValueError:
                self.fail(f"{value!r} is not an ISO 8601 time (2026-12-04T03:10:00Z)", param, ctx)
        return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


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
    type=IsoTime(),
    help="Where it ends [default: now]: an incident's time, looked at afterwards. ISO 8601, "
    "with an offset (a log line's `at`, an alert's `activeAt`, as they are), or else UTC.",
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
    end = (until or datetime.now(UTC)).timestamp()
    start = end - minutes * 60
    step = max(1.0, (end - start) / POINTS)
    drawn = asyncio.run(query_panels(prometheus, start=start, end=end, step=step))
    page = render(drawn, start=start, end=end, step=step, title=f"orderflow: hub {settings.hub}")
    if out is None:
        sys.stdout.write(page)
    else:
        out.write_text(page, encoding="utf-8")
    empty = [d.panel.title for d in drawn if not d.series]  # a listed series has points
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
