"""The documentation stays true to itself: decisions cited by slug only, each decision a whole
record and listed, the README short with links that resolve, and the changelog's release the
package's. (`mkdocs build --strict`, in CI, checks every link and citation of the site itself; the
generated reference pages are checked in tests/unit/test_reference_pages.py and test_deploy.py.)"""

from __future__ import annotations

import re
import subprocess
from importlib.metadata import version
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DECISIONS = ROOT / "docs" / "decisions"
BY_NUMBER = re.compile(r"\b[Dd]ecisions?(?:\s|#)+\d")
CITATION = re.compile(r"(?<![\w/-])decision:([a-z0-9]+(?:-[a-z0-9]+)*)")
TEXT = {".py", ".md", ".yml", ".yaml", ".toml", ".sh", ".html", ".js", ".json", ".example", ""}


def tracked_texts() -> dict[str, str]:
    names = subprocess.run(
        ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    texts = {}
    for name in names:
        path = ROOT / name
        if name == "tests/unit/test_docs.py":  # its own examples of bad citations
            continue
        if path.suffix in TEXT and path.is_file() and "lock" not in path.name:
            try:
                texts[name] = path.read_text()
            except UnicodeDecodeError:
                continue
    return texts


def slugs() -> dict[str, Path]:
    return {p.stem.split("-", 1)[1]: p for p in DECISIONS.glob("[0-9][0-9][0-9][0-9]-*.md")}


def citation_problems(texts: dict[str, str], known: set[str]) -> list[str]:
    problems = []
    for name, text in texts.items():
        for match in BY_NUMBER.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            problems.append(f"{name}:{line}: cites a decision by number: {match.group(0)!r}")
        for match in CITATION.finditer(text):
            if match.group(1) not in known:
                line = text.count("\n", 0, match.start()) + 1
                problems.append(f"{name}:{line}: decision:{match.group(1)} names no decision")
    return problems


@pytest.mark.skipif(not (ROOT / ".git").exists(), reason="needs the git checkout's file list")
def test_decisions_are_cited_by_slug_and_every_citation_names_one() -> None:
    assert citation_problems(tracked_texts(), set(slugs())) == []


def test_the_citation_check_can_fail() -> None:
    texts = {"a.py": "# see decision 12\n# and decision:no-such-thing\n# decision:known\n"}
    assert citation_problems(texts, {"known"}) == [
        "a.py:1: cites a decision by number: 'decision 1'",
        "a.py:2: decision:no-such-thing names no decision",
    ]


def test_every_decision_is_a_whole_record_listed_in_the_index() -> None:
    index = (DECISIONS / "index.md").read_text()
    numbers = sorted(int(p.name[:4]) for p in slugs().values())
    assert numbers == list(range(1, len(numbers) + 1)), "decisions are numbered 1, 2, ... and kept"
    for slug, path in slugs().items():
        text = path.read_text()
        lines = text.split("\n")
        assert lines[0].startswith("# ") and not lines[1].strip(), f"{path.name}: one title line"
        assert lines[2] == f"Cited as `decision:{slug}`.", path.name
        parts = re.split(r"^## (Context|Decision|Consequences)\s*$", text, flags=re.M)
        assert parts[1::2] == ["Context", "Decision", "Consequences"], path.name
        assert all(part.strip() for part in parts[2::2]), f"{path.name}: an empty section"
        assert f"]({path.name})" in index, f"{path.name} is not in docs/decisions/index.md"


def test_the_readme_is_a_short_front_door_whose_links_resolve() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 200
    for page in ("README.md", "CONTRIBUTING.md", "CHANGELOG.md"):
        text = (ROOT / page).read_text()
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if target.startswith(("http://", "https://", "mailto:")):
                continue
            path = target.split("#", 1)[0]
            assert (ROOT / path).exists(), f"{page} links to {target}, which does not exist"


def test_the_changelog_leads_with_this_release() -> None:
    changelog = (ROOT / "CHANGELOG.md").read_text()
    first = re.search(r"^## (\S+)", changelog, re.M)
    assert first is not None
    assert first.group(1) == version("orderflow")
