"""The documentation's reference pages (docs/reference/) say all there is: every setting has a
description and its page names it; every command and option of `orderflow` has help text and
cli.md names it, in its command's section; every path and method of the OpenAPI document is in
http-api.md. Each check is a function returning the problems it finds, with a case showing that
it rejects a bad input. That each committed page is what the code generates now is
tests/unit/test_deploy.py's `test_the_committed_file_is_what_the_code_generates` (all three are
among `generated_files`): `orderflow deploy write` regenerates them."""

from __future__ import annotations

import json
import re
from pathlib import Path

import click
import pytest
from pydantic.fields import FieldInfo

from deployment.reference import reference_pages
from deployment.reference.cli import commands, options
from deployment.reference.http_api import operations
from deployment.reference.markdown import inline, paragraphs
from services.api.app import openapi_document
from services.cli.main import main
from shared.config import FIELDS
from shared.config.base import Section

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
PAGES = ("configuration.md", "cli.md", "http-api.md")
REGENERATE = "run `orderflow deploy write` and commit docs/reference/"


def page(name: str) -> str:
    return (DOCS / "reference" / name).read_text()


# -- the settings -------------------------------------------------------------------------------


def undocumented_settings(fields: dict[str, FieldInfo]) -> list[str]:
    return [
        f"ORDERFLOW_{name.upper()} has no description (a docstring under the field)"
        for name, field in fields.items()
        if not (field.description or "").strip()
    ]


def settings_missing_from(text: str, fields: dict[str, FieldInfo]) -> list[str]:
    return [
        f"configuration.md lacks ORDERFLOW_{name.upper()} ({REGENERATE})"
        for name in fields
        if f"### `ORDERFLOW_{name.upper()}`" not in text
    ]


def test_every_setting_has_a_description_and_its_section_on_the_page() -> None:
    assert undocumented_settings(FIELDS) == []
    assert settings_missing_from(page("configuration.md"), FIELDS) == []


def test_a_setting_without_a_docstring_or_off_the_page_is_found() -> None:
    class Bare(Section):
        documented: int = 1
        """Said."""
        bare: int = 2

    fields = dict(Bare.model_fields)
    assert undocumented_settings(fields) == [
        "ORDERFLOW_BARE has no description (a docstring under the field)"
    ]
    text = page("configuration.md").replace("### `ORDERFLOW_PREFETCH`", "### prefetch")
    assert settings_missing_from(text, FIELDS) == [
        f"configuration.md lacks ORDERFLOW_PREFETCH ({REGENERATE})"
    ]


# -- the command line ---------------------------------------------------------------------------


def undocumented_commands(group: click.Command) -> list[str]:
    problems = []
    for ctx, command in commands(group):
        if not (command.help or command.short_help):
            problems.append(f"{ctx.command_path}: no help (its docstring)")
        problems += [
            f"{ctx.command_path} {option.opts[0]}: no help"
            for option in options(command, ctx)
            if not (option.help or "").strip()
        ]
    return problems


def sections(text: str) -> dict[str, str]:
    """A page's sections by the code span of their heading (`orderflow alerts list`)."""
    found = re.split(r"^#{2,4} `([^`]+)`\n", text, flags=re.M)
    return dict(zip(found[1::2], found[2::2], strict=True))


def commands_missing_from(text: str, group: click.Command) -> list[str]:
    shown = sections(text)
    problems = []
    for ctx, command in commands(group):
        section = shown.get(ctx.command_path)
        if section is None:
            problems.append(f"cli.md lacks {ctx.command_path} ({REGENERATE})")
            continue
        problems += [
            f"cli.md lacks {ctx.command_path} {name} ({REGENERATE})"
            for option in options(command, ctx)
            for name in option.opts + option.secondary_opts
            if not re.search(rf"^- `[^`]*(?<![\w-]){re.escape(name)}(?![\w-])", section, re.M)
        ]
    return problems


def test_every_command_and_option_has_help_and_is_on_the_page() -> None:
    assert undocumented_commands(main) == []
    assert commands_missing_from(page("cli.md"), main) == []


def test_an_undocumented_option_or_one_off_the_page_is_found() -> None:
    @click.group()
    def tool() -> None:
        """A tool."""

    @tool.command()
    @click.option("--fast", is_flag=True)
    @click.option("--slow", is_flag=True, help="Said.")
    def run(fast: bool, slow: bool) -> None:
        pass  # no docstring

    assert undocumented_commands(tool) == [
        "orderflow run: no help (its docstring)",
        "orderflow run --fast: no help",
    ]
    text = page("cli.md").replace("- `--limit INTEGER RANGE`", "- `limit`", 1)
    assert commands_missing_from(text, main) == [
        f"cli.md lacks orderflow alerts list --limit ({REGENERATE})"
    ]


# -- the HTTP API -------------------------------------------------------------------------------


def endpoints_missing_from(text: str, openapi: str) -> list[str]:
    return [
        f"http-api.md lacks {method.upper()} {path} ({REGENERATE})"
        for path, method, _ in operations(json.loads(openapi))
        if f"### `{method.upper()} {path}`" not in text
    ]


def test_every_path_and_method_is_on_the_page() -> None:
    openapi = openapi_document()
    assert len(operations(json.loads(openapi))) > 20
    assert endpoints_missing_from(page("http-api.md"), openapi) == []


def test_an_endpoint_off_the_page_is_found() -> None:
    text = page("http-api.md").replace("### `GET /ops/stats`", "### stats")
    assert endpoints_missing_from(text, openapi_document()) == [
        f"http-api.md lacks GET /ops/stats ({REGENERATE})"
    ]


# -- what `mkdocs build --strict` asks of a page ------------------------------------------------


def page_problems(name: str, text: str) -> list[str]:
    """A title first; relative links only, each to a file under docs/; no raw HTML."""
    problems = [] if text.startswith("# ") else [f"{name}: the first line is no `# Title`"]
    prose = re.sub(r"```.*?```", "", text, flags=re.S)
    prose = re.sub(r"(`+).+?\1", "", prose)
    for target in re.findall(r"\]\(([^)\s]+)\)", prose):
        path = target.split("#")[0]
        if re.match(r"^[a-z]+:|^/", target) or not (DOCS / "reference" / path).resolve().is_file():
            problems.append(f"{name}: link {target} is not to a file under docs/")
    problems += [f"{name}: raw HTML {tag}" for tag in re.findall(r"<[A-Za-z/][^>]*>", prose)]
    return problems


@pytest.mark.parametrize("name", PAGES)
def test_the_page_builds_under_mkdocs_strict(name: str) -> None:
    assert page_problems(name, page(name)) == []


def test_a_bad_link_raw_html_or_a_missing_title_is_found() -> None:
    text = "Intro\n\n[x](https://example.org) [y](../nowhere.json) <b>bold</b> `<kept>`\n"
    assert page_problems("p.md", text) == [
        "p.md: the first line is no `# Title`",
        "p.md: link https://example.org is not to a file under docs/",
        "p.md: link ../nowhere.json is not to a file under docs/",
        "p.md: raw HTML <b>",
        "p.md: raw HTML </b>",
    ]


def test_the_pages_are_the_three_generated() -> None:
    generated = reference_pages(openapi_document(), main)
    assert sorted(generated) == sorted(f"docs/reference/{name}" for name in PAGES)


# -- the Markdown of text from the code ---------------------------------------------------------


def test_prose_escapes_markup_but_keeps_code_spans() -> None:
    assert inline("ORDERFLOW_* lines,\n  a <hub> and `<hub>.orders|x`") == (
        r"ORDERFLOW\_\* lines, a &lt;hub&gt; and `<hub>.orders|x`"
    )
    assert paragraphs("First.\n\n    \b\n    keep  this\n      as is\n\n    Last.\f hidden") == [
        "First.",
        "```text\nkeep  this\n  as is\n```",
        "Last.",
    ]
