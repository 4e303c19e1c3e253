"""The dashboard snapshot's page (services/operator/snapshot.py): legends as Grafana formats them,
gaps for NaN, "No data" where nothing came back, every panel in the dashboard's order, and no
label value able to put markup into the page. Its queries against a real Prometheus are in
tests/system/test_observability.py."""

from __future__ import annotations

import asyncio
import math
import socket
from datetime import UTC, datetime
from html.parser import HTMLParser
from pathlib import Path

import pytest
from aiohttp import web
from click.testing import CliRunner
from hypothesis import example, given
from hypothesis import strategies as st

from services.cli.main import main
from services.operator.snapshot import (
    Drawn,
    Series,
    formatted,
    legend,
    read_answer,
    render,
    runs,
    series_of,
    widened,
)
from shared.panels import PANELS

START, END = 1_700_000_000.0, 1_700_000_600.0
STEP = 5.0


class Structure(HTMLParser):
    """The elements a page opens, and any script or handler attribute in it."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.active: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        if tag == "script" or any(name.startswith("on") for name, _ in attrs):
            self.active.append(tag)


def parsed(page: str) -> Structure:
    structure = Structure()
    structure.feed(page)
    return structure


def test_legends_follow_grafanas_format() -> None:
    labels = {"step": "charge", "action": "do", "__name__": "x"}
    assert legend("p95 {{step}} {{ action }}", labels) == "p95 charge do"
    assert legend("{{missing}}", labels) == "{action=do, step=charge}"
    assert legend("backlog", {}) == "backlog"


def test_nan_samples_are_gaps_not_points() -> None:
    result = [
        {"metric": {"state": "Pending"}, "values": [[1, "3"], [2, "NaN"], [3, "+Inf"]]},
        {"metric": {"state": "Error"}, "values": [[1, "NaN"], [2, "NaN"]]},
    ]
    [series] = series_of(result, "{{state}}")  # the one with no point at all is not listed
    assert series == Series("Pending", ((1.0, 3.0),))


def test_every_panel_appears_in_order_and_an_empty_one_says_no_data() -> None:
    drawn = [
        Drawn(panel, (Series("a", ((START, 1.0), (START + STEP, 2.0))),) if n % 2 else ())
        for n, panel in enumerate(PANELS)
    ]
    page = render(drawn, start=START, end=END, step=STEP, title="orderflow: hub h")
    positions = [page.index(panel.title) for panel in PANELS]
    assert positions == sorted(positions)
    assert page.count("No data") == sum(1 for n in range(len(PANELS)) if n % 2 == 0)
    assert page.count("<polyline") == len(PANELS) // 2
    assert parsed(page).active == []


def test_a_refused_expression_is_shown_in_its_panel() -> None:
    drawn = [Drawn(PANELS[0], (), ("bad(: parse error",))]
    page = render(drawn, start=START, end=END, step=STEP, title="t")
    assert "bad(: parse error" in page and "No data" in page


@given(
    values=st.lists(st.text(max_size=30), min_size=1, max_size=12),
    points=st.lists(
        st.floats(allow_nan=False, allow_infinity=False, width=32), min_size=0, max_size=20
    ),
)
# Found by hypothesis: one huge negative value made the range empty (low + 1.0 == low).
@example(values=["q"], points=[-3.4e38])
def test_no_label_value_puts_markup_into_the_page(values: list[str], points: list[float]) -> None:
    """Label values come from metrics (queue and operation names, a hub's): whatever they hold,
    the page has only the elements the renderer writes, and no script."""
    series = tuple(
        Series(value, tuple((START + i, p) for i, p in enumerate(points))) for value in values
    )
    page = render([Drawn(PANELS[0], series)], start=START, end=END, step=STEP, title=values[0])
    structure = parsed(page)
    assert structure.active == []
    assert set(structure.tags) <= {
        "html", "head", "meta", "title", "style", "body", "h1", "p", "main", "section", "h2",
        "svg", "line", "text", "polyline", "circle", "ul", "li", "span",
    }  # fmt: skip
    assert all(math.isfinite(float(x)) for x in _coordinates(page))


def _coordinates(page: str) -> list[str]:
    """Every number in the polylines' points."""
    found: list[str] = []
    for chunk in page.split('points="')[1:]:
        for pair in chunk.split('"', 1)[0].split():
            found.extend(pair.split(","))
    return found


def test_units_read_as_grafana_shows_them() -> None:
    assert formatted(0.094, "s") == "94 ms"
    assert formatted(2.5, "s") == "2.5 s"
    assert formatted(1500, "short") == "1.5k"
    assert formatted(12.5, "ops") == "12.5/s"


def test_prometheus_unreachable_is_one_line_and_exit_3(tmp_path: Path) -> None:
    with socket.socket() as closed:  # a port nothing listens on
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    out = tmp_path / "snapshot.html"
    result = CliRunner().invoke(
        main, ["snapshot", "--prometheus", f"http://127.0.0.1:{port}", "--out", str(out)]
    )
    assert result.exit_code == 3, result.output
    assert f"Prometheus at http://127.0.0.1:{port} does not answer" in result.output
    assert "Traceback" not in result.output and not out.exists()


def test_a_gap_in_the_samples_is_a_gap_in_the_line() -> None:
    """NaN samples are dropped, and a series that went stale has none: the line stops there
    and starts again, never drawn straight across the hole."""
    points = ((START, 1.0), (START + STEP, 2.0), (START + 4 * STEP, 2.0), (START + 5 * STEP, 1.0))
    assert runs(points, STEP) == [list(points[:2]), list(points[2:])]
    page = render(
        [Drawn(PANELS[0], (Series("a", points),))], start=START, end=END, step=STEP, title="t"
    )
    assert page.count("<polyline") == 2


def test_ranges_shorter_than_the_step_are_widened_to_it() -> None:
    expr = "sum(rate(a[1m])) / sum(increase(b[5m])) + c[2h]"
    assert widened(expr, 15) == expr
    assert widened(expr, 360) == "sum(rate(a[360s])) / sum(increase(b[360s])) + c[2h]"


@pytest.mark.parametrize(
    ("status", "body", "error"),
    [
        (502, None, "HTTP 502, not a Prometheus answer"),
        (200, [1, 2], "HTTP 200, not a Prometheus answer"),
        (400, {"status": "error", "error": "parse error"}, "parse error"),
        (503, {"status": "error"}, "HTTP 503"),
        (200, {"status": "success", "data": {"resultType": "vector", "result": []}}, "vector"),
        (200, {"status": "success"}, "malformed"),
    ],
)
def test_an_answer_that_is_not_a_range_is_an_error_in_its_panel(
    status: int, body: object, error: str
) -> None:
    series, errors, _ = read_answer("up", "{{job}}", status, body)
    assert series == [] and len(errors) == 1 and error in errors[0]


def test_prometheus_warnings_are_shown_with_the_data() -> None:
    body = {
        "status": "success",
        "warnings": ["partial data"],
        "infos": ["metric might not be a counter"],
        "data": {"resultType": "matrix", "result": [{"metric": {}, "values": [[1, "2"]]}]},
    }
    series, errors, notes = read_answer("up", "up", 200, body)
    assert [s.points for s in series] == [((1.0, 2.0),)] and errors == []
    assert notes == ["up: partial data", "up: metric might not be a counter"]
    page = render(
        [Drawn(PANELS[0], tuple(series), (), tuple(notes))],
        start=START, end=END, step=STEP, title="t",
    )  # fmt: skip
    assert "partial data" in page


async def test_until_with_an_offset_is_that_instant(tmp_path: Path) -> None:
    """A log line's `at`, pasted as it is, ends the range at that instant, whatever its
    offset; a time without one is UTC. (The Prometheus here is a stand-in that records the
    range asked for and answers an empty matrix.)"""
    asked: list[float] = []

    async def query_range(request: web.Request) -> web.Response:
        asked.append(float(request.query["end"]))
        return web.json_response(
            {"status": "success", "data": {"resultType": "matrix", "result": []}}
        )

    app = web.Application()
    app.router.add_get("/api/v1/query_range", query_range)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        for until in (
            "2026-12-04T04:10:00.123+01:00",  # a log line's `at`, elsewhere
            "2026-12-04T03:10:00.123000000Z",  # an alert's `activeAt`
            "2026-12-04T03:10:00.123",  # no offset: UTC
        ):
            asked.clear()
            result = await asyncio.to_thread(
                CliRunner().invoke,
                main,
                ["snapshot", "--prometheus", f"http://127.0.0.1:{port}", "--until", until],
            )
            assert result.exit_code == 0, result.output
            assert set(asked) == {datetime(2026, 12, 4, 3, 10, 0, 123000, UTC).timestamp()}
            assert "No data" in result.stdout and "11 with no data" in result.stderr
    finally:
        await runner.cleanup()


def test_out_into_a_missing_directory_is_a_usage_error(tmp_path: Path) -> None:
    out = tmp_path / "missing" / "snapshot.html"
    result = CliRunner().invoke(main, ["snapshot", "--out", str(out)])
    assert result.exit_code == 2 and "is not a directory" in result.output


def test_until_that_is_not_a_time_is_a_usage_error() -> None:
    result = CliRunner().invoke(main, ["snapshot", "--until", "yesterday"])
    assert result.exit_code == 2 and "is not an ISO 8601 time" in result.output
