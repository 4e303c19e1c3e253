"""Text from the code (docstrings, help, the OpenAPI document's descriptions) as Markdown that
says what the text says: code spans are kept, and outside them every character Markdown would
take for markup (emphasis, a link, an HTML tag, a table cell's end) is escaped."""

from __future__ import annotations

import inspect
import re

CODE_SPAN = re.compile(r"(`+)(.+?)\1", re.S)
MARKUP = re.compile(r"([\\*_\[\]|])")
NO_REWRAP = "\b"
"""click's marker of a paragraph kept as written (an example command line)."""


def _escape(text: str) -> str:
    text = MARKUP.sub(r"\\\1", text)
    return text.replace("<", "&lt;").replace(">", "&gt;")


def inline(text: str) -> str:
    """One paragraph of prose on one line, its markup characters escaped."""
    text = " ".join(text.split())
    parts: list[str] = []
    position = 0
    for span in CODE_SPAN.finditer(text):
        parts += [_escape(text[position : span.start()]), span.group(0)]
        position = span.end()
    parts.append(_escape(text[position:]))
    return "".join(parts)


def paragraphs(text: str) -> list[str]:
    """A docstring or help text as Markdown blocks: each paragraph on one line, a paragraph
    click keeps as written (`\\b`) as a code block; what follows click's `\\f` is left out."""
    text = inspect.cleandoc(text).split("\f")[0]
    blocks: list[str] = []
    for paragraph in re.split(r"\n\s*\n", text):
        if not paragraph.strip():
            continue
        if paragraph.lstrip().startswith(NO_REWRAP):
            kept = inspect.cleandoc(paragraph.lstrip().removeprefix(NO_REWRAP))
            blocks.append(f"```text\n{kept}\n```")
        else:
            blocks.append(inline(paragraph))
    return blocks


def code(text: str) -> str:
    """`text` as a code span, whatever backticks it holds."""
    fence = "`" * (max((len(run) for run in re.findall(r"`+", text)), default=0) + 1)
    padding = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{padding}{text}{padding}{fence}"


def document(blocks: list[str]) -> str:
    """Blocks joined into a page: one blank line between blocks, one newline at the end."""
    return "\n\n".join(block for block in blocks if block) + "\n"
