"""A snapshot of the dashboard: every panel of the provisioned Grafana dashboard (the same
`PANELS`, shared/panels.py), queried from Prometheus over a time range and drawn
into one self-contained HTML file (inline SVG, no script, nothing fetched when it is opened).

For what Grafana cannot do for you at 3 a.m.: attach what the dashboard showed to an incident
report, look at it where Grafana is not (a laptop, a ticket, a chat), or keep it after
Prometheus's retention dropped the data. `orderflow snapshot --prometheus URL` writes one.

The page follows the dashboard: the panels in its order, two to a row, each with its title, its
series named by the panel's legend formats (`{{label}}`), and "No data" where Grafana would say
so. Every label value and title is escaped: metric labels carry queue and operation names.
"""

from __future__ import annotations

import html
import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import aiohttp

from shared.errors import ServiceUnavailable, one_line
from shared.panels import PANELS, Panel

WIDTH = 600
HEIGHT = 240
PLOT = (56, 12, WIDTH - 12, HEIGHT - 28)
"""The plot area inside a panel's SVG: left, top, right, bottom."""
GREY = "#c0c0c0"
COLOURS = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
)
"""One per series a legend names."""
MAX_LEGEND = len(COLOURS)
"""Series a legend names; a panel with more lists the busiest (by peak) first, and draws the
rest in grey."""
LEGEND_LABEL = re.compile(r"\{\{\s*(\w+)\s*\}\}")


@dataclass(frozen=True)
class Series:
    """One line of a panel: its legend and its points (unix seconds, value)."""

    name: str
    points: tuple[tuple[float, float], ...]


@dataclass(frozen=True)
class Drawn:
    """One panel as queried: its series, the errors of expressions Prometheus refused (or
    answered with something else than a range), and its warnings (partial data, say)."""

    panel: Panel
    series: tuple[Series, ...]
    errors: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()


def legend(template: str, labels: dict[str, str]) -> str:
    """Grafana's legend format: `{{label}}` replaced by the series' value of that label
    (empty when it has none); a legend that comes out blank names the series by its labels."""
    name = LEGEND_LABEL.sub(lambda m: labels.get(m.group(1), ""), template).strip()
    if name:
        return name
    shown = ", ".join(f"{k}={v}" for k, v in sorted(labels.items()) if k != "__name__")
    return f"{{{shown}}}"


def series_of(result: Sequence[dict[str, Any]], template: str) -> list[Series]:
    """The series of a `query_range` matrix, NaN and infinite samples left out (a quantile of
    no observations is NaN: a gap, as Grafana draws it), and a series left with no point at
    all not listed (the quantiles of steps that never ran in the range)."""
    found = []
    for item in result:
        points = []
        for at, raw in item.get("values", []):
            value = float(raw)
            if math.isfinite(value):
                points.append((float(at), value))
        if points:
            found.append(Series(legend(template, dict(item.get("metric", {}))), tuple(points)))
    return found


RANGE_SELECTOR = re.compile(r"\[(\d+)([smh])\]")
UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600}


def widened(expr: str, step: float) -> str:
    """`expr` with every range selector shorter than `step` widened to it, as Grafana's
    `$__rate_interval` does: `rate(x[1m])` evaluated every 6 minutes would see one minute in
    six, and miss what happened between."""

    def one(match: re.Match[str]) -> str:
        seconds = int(match.group(1)) * UNIT_SECONDS[match.group(2)]
        return match.group(0) if seconds >= step else f"[{math.ceil(step)}s]"

    return RANGE_SELECTOR.sub(one, expr)


def read_answer(
    expr: str, template: str, status: int, body: Any
) -> tuple[list[Series], list[str], list[str]]:
    """One `query_range` answer: its series, the error that replaced them, and its warnings.
    Anything but a successful range (a proxy's page, an instant vector from a look-alike
    backend) is an error shown in the panel, never a failure of the whole snapshot."""
    if not isinstance(body, dict):
        return [], [f"{expr}: HTTP {status}, not a Prometheus answer"], []
    notes = [f"{expr}: {note}" for key in ("warnings", "infos") for note in body.get(key) or []]
    if body.get("status") != "success":
        return [], [f"{expr}: {body.get('error') or f'HTTP {status}'}"], notes
    data = body.get("data")
    kind = data.get("resultType") if isinstance(data, dict) else None
    result = data.get("result") if isinstance(data, dict) else None
    if kind != "matrix" or not isinstance(result, list):
        return [], [f"{expr}: a {kind or 'malformed'} answer, not a range"], notes
    return series_of([r for r in result if isinstance(r, dict)], template), [], notes


async def query_panels(
    prometheus: str,
    *,
    start: float,
    end: float,
    step: float,
    panels: Sequence[Panel] = PANELS,
    timeout: float = 10.0,
) -> list[Drawn]:
    """Every panel's expressions over [start, end], one `query_range` each (their ranges
    widened to the step). What Prometheus refuses is shown in its panel; Prometheus
    unreachable is `ServiceUnavailable`."""
    url = prometheus.rstrip("/") + "/api/v1/query_range"
    drawn = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as session:
        for panel in panels:
            series: list[Series] = []
            errors: list[str] = []
            notes: list[str] = []
            for expr, template in panel.targets:
                params = {
                    "query": widened(expr, step),
                    "start": str(start),
                    "end": str(end),
                    "step": str(step),
                }
                try:
                    async with session.get(url, params=params) as answer:
                        status, text = answer.status, await answer.text()
                except (aiohttp.ClientError, TimeoutError) as exc:
                    raise ServiceUnavailable(
                        f"Prometheus at {prometheus} does not answer: {one_line(exc)}"
                    ) from exc
                try:
                    body: Any = json.loads(text)
                except ValueError:
                    body = None
                found, failed, noted = read_answer(expr, template, status, body)
                series += found
                errors += failed
                notes += noted
            if len(series) > MAX_LEGEND:  # the legend names the busiest first
                series.sort(key=lambda one: max(abs(v) for _, v in one.points), reverse=True)
            drawn.append(Drawn(panel, tuple(series), tuple(errors), tuple(notes)))
    return drawn


def formatted(value: float, unit: str) -> str:
    """A tick label in the panel's unit (Grafana's `short`, `ops` and `s`)."""
    if unit == "s":
        return f"{value * 1000:.0f} ms" if abs(value) < 1 else f"{value:.3g} s"
    for size, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= size:
            text = f"{value / size:.3g}{suffix}"
            break
    else:
        text = f"{value:.3g}"
    return f"{text}/s" if unit == "ops" else text


def runs(points: Sequence[tuple[float, float]], step: float) -> list[list[tuple[float, float]]]:
    """The points cut where samples are missing (NaN, or a series gone stale): a gap, as
    Grafana leaves one, rather than a line drawn across it."""
    cut: list[list[tuple[float, float]]] = []
    for point in points:
        if cut and point[0] - cut[-1][-1][0] <= step * 1.5:
            cut[-1].append(point)
        else:
            cut.append([point])
    return cut


def colour(n: int) -> str:
    """The n-th series' colour; past the legend's, grey (drawn, but not named)."""
    return COLOURS[n] if n < MAX_LEGEND else GREY


def _svg(drawn: Drawn, start: float, end: float, step: float) -> str:
    left, top, right, bottom = PLOT
    values = [v for s in drawn.series for _, v in s.points]
    low = min([0.0, *values])
    high = max([0.0, *values])
    if not high > low:  # flat, or nothing: a range around it (1.0 lost to a huge value's ulp)
        high = low + max(1.0, abs(low))
    span = end - start or 1.0

    def x(at: float) -> float:
        return left + (at - start) / span * (right - left)

    def y(value: float) -> float:
        return bottom - (value - low) / (high - low) * (bottom - top)

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
        f'viewBox="0 0 {WIDTH} {HEIGHT}" role="img">'
    ]
    for fraction in (0.0, 0.5, 1.0):  # the grid, with its values
        value = low + fraction * (high - low)
        parts.append(
            f'<line x1="{left}" x2="{right}" y1="{y(value):.1f}" y2="{y(value):.1f}" '
            'stroke="#ddd"/>'
            f'<text x="{left - 6}" y="{y(value) + 4:.1f}" text-anchor="end" font-size="11" '
            f'fill="#555">{html.escape(formatted(value, drawn.panel.unit))}</text>'
        )
    shown = "%Y-%m-%d %H:%M" if span > 24 * 3600 else "%H:%M:%S"
    for at, anchor in ((start, "start"), (end, "end")):
        clock = datetime.fromtimestamp(at, UTC).strftime(shown)
        parts.append(
            f'<text x="{x(at):.1f}" y="{bottom + 18}" text-anchor="{anchor}" font-size="11" '
            f'fill="#555">{clock}</text>'
        )
    # Drawn last first: the named series on top of the grey ones.
    for n, series in reversed(list(enumerate(drawn.series))):
        for run in runs(series.points, step):
            if len(run) == 1:
                (at, value) = run[0]
                parts.append(
                    f'<circle cx="{x(at):.1f}" cy="{y(value):.1f}" r="2" fill="{colour(n)}"/>'
                )
            else:
                line = " ".join(f"{x(at):.1f},{y(value):.1f}" for at, value in run)
                parts.append(
                    f'<polyline points="{line}" fill="none" stroke="{colour(n)}" '
                    'stroke-width="1.5"/>'
                )
    if not values:
        parts.append(
            f'<text x="{(left + right) / 2}" y="{(top + bottom) / 2}" text-anchor="middle" '
            'font-size="14" fill="#888">No data</text>'
        )
    parts.append("</svg>")
    return "".join(parts)


def _legend_html(series: Sequence[Series]) -> str:
    items = [
        f'<li><span style="background:{colour(n)}"></span>{html.escape(s.name)}</li>'
        for n, s in enumerate(series[:MAX_LEGEND])
    ]
    if len(series) > MAX_LEGEND:
        items.append(
            f'<li><span style="background:{GREY}"></span>… and {len(series) - MAX_LEGEND} more</li>'
        )
    return f'<ul class="legend">{"".join(items)}</ul>'


STYLE = """
body { font-family: sans-serif; margin: 16px; color: #222; background: #f4f5f7; }
h1 { font-size: 18px; margin: 0 0 4px; } p.range { margin: 0 0 12px; color: #555; }
main { display: grid; grid-template-columns: repeat(2, 624px); gap: 12px; }
section { background: #fff; border: 1px solid #d8dbe0; border-radius: 4px; padding: 6px; }
h2 { font-size: 14px; margin: 2px 6px 4px; }
ul.legend { list-style: none; margin: 2px 6px; padding: 0; font-size: 12px; }
ul.legend li { display: inline-block; margin-right: 12px; }
ul.legend span { display: inline-block; width: 10px; height: 10px; margin-right: 4px; }
p.error { color: #b00; font-size: 12px; margin: 2px 6px; }
p.note { color: #8a6d00; font-size: 12px; margin: 2px 6px; }
"""


def render(drawn: Sequence[Drawn], *, start: float, end: float, step: float, title: str) -> str:
    """The snapshot page: one section per panel, in the dashboard's order."""
    sections = []
    for panel in drawn:
        errors = "".join(f'<p class="error">{html.escape(e)}</p>' for e in panel.errors)
        notes = "".join(f'<p class="note">{html.escape(n)}</p>' for n in panel.notes)
        sections.append(
            f"<section><h2>{html.escape(panel.panel.title)}</h2>"
            f"{_svg(panel, start, end, step)}{_legend_html(panel.series)}{errors}{notes}"
            "</section>"
        )
    since = datetime.fromtimestamp(start, UTC).isoformat(timespec="seconds")
    until = datetime.fromtimestamp(end, UTC).isoformat(timespec="seconds")
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        f"<title>{html.escape(title)}</title><style>{STYLE}</style></head><body>"
        f"<h1>{html.escape(title)}</h1>"
        f'<p class="range">{since} to {until} (UTC)</p>'
        f"<main>{''.join(sections)}</main></body></html>\n"
    )
