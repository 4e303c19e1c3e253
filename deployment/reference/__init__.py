"""The documentation site's reference pages (docs/reference/), generated from the code: the
settings (`configuration.md`), the `orderflow` command's parser (`cli.md`) and the HTTP API's
OpenAPI document (`http-api.md`).

Regenerate them, with every other generated file, with `orderflow deploy write`; `orderflow
deploy write --check` (and tests/unit/test_deploy.py) fails while one is stale. The CLI's group
and the OpenAPI document are handed in, as `deployment.files` does, so that the generators import
neither the CLI nor the API.
"""

from __future__ import annotations

import click

from deployment.reference.cli import cli_page
from deployment.reference.configuration import configuration_page
from deployment.reference.http_api import http_api_page

PAGES = "docs/reference"


def reference_pages(openapi: str, cli: click.Command) -> dict[str, str]:
    """Path relative to the repository root -> the page's Markdown."""
    return {
        f"{PAGES}/configuration.md": configuration_page(),
        f"{PAGES}/cli.md": cli_page(cli),
        f"{PAGES}/http-api.md": http_api_page(openapi),
    }
