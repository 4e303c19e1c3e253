"""MkDocs hook: every `decision:<slug>` in a page becomes a link to that decision's own page.

Code, tests and documents cite a design decision by its slug (docs/decisions/NNNN-<slug>.md). A
citation that names no decision is logged as a warning, which `mkdocs build --strict` turns into
a failed build (tests/unit/test_docs.py checks the code and tests the same way).
"""

from __future__ import annotations

import logging
import posixpath
import re
from pathlib import Path
from typing import Any

log = logging.getLogger("mkdocs.plugins.decisions")

CITATION = re.compile(r"(?<![`\w/-])decision:([a-z0-9]+(?:-[a-z0-9]+)*)")
DECISIONS = Path(__file__).resolve().parents[1] / "decisions"


def _stems() -> dict[str, str]:
    return {p.stem.split("-", 1)[1]: p.stem for p in DECISIONS.glob("[0-9][0-9][0-9][0-9]-*.md")}


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    stems = _stems()
    here = posixpath.dirname(page.file.src_uri)

    def link(match: re.Match[str]) -> str:
        slug = match.group(1)
        stem = stems.get(slug)
        if stem is None:
            log.warning("%s cites decision:%s, which is no decision", page.file.src_uri, slug)
            return match.group(0)
        target = posixpath.relpath(f"decisions/{stem}.md", here or ".")
        return f"[{slug}]({target})"

    return CITATION.sub(link, markdown)
