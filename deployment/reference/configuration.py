"""docs/reference/configuration.md: every setting, by the section of `Settings` that holds it,
with its environment variable, type, bounds, default and documentation (the field's docstring,
which is also its line in `.env.example`)."""

from __future__ import annotations

import inspect
import types
from typing import Any, Union, get_args, get_origin

import annotated_types
from pydantic import SecretStr
from pydantic.fields import FieldInfo

from deployment.envfile import NOT_SETTINGS, SET_BY_COMPOSE
from deployment.reference.markdown import code, document, inline
from shared.config import SECTIONS
from shared.config.base import Section

UNITS = {"_s": "seconds", "_ms": "milliseconds", "_bytes": "bytes"}
"""A setting's unit, by the end of its name (the code's convention)."""

TYPES = {
    str: "string",
    int: "integer",
    float: "number",
    bool: "boolean (`true` or `false`)",
    SecretStr: "secret string",
}

BOUNDS = {
    annotated_types.Gt: ("gt", "more than {}"),
    annotated_types.Ge: ("ge", "at least {}"),
    annotated_types.Lt: ("lt", "less than {}"),
    annotated_types.Le: ("le", "at most {}"),
    annotated_types.MaxLen: ("max_length", "at most {} characters"),
}

INTRO = """\
Every process reads its settings once, at start-up, from environment variables named
`ORDERFLOW_<SETTING>`, and from the `ORDERFLOW_*` lines of a `.env` file (`.env` in the current
directory, or the file `ORDERFLOW_ENV_FILE` names); a variable set in the environment wins over
the file's line, and an empty value means the default. Where `ORDERFLOW_SECRETS_DIR` names a
directory (the compose deployment's `/run/secrets`), the file `orderflow_<setting>` in it is read
too (an environment variable still wins). A value out of bounds stops the command with one line
naming the variable (exit code 2). `orderflow --hub`, `--store-url` and `--rabbitmq-url` override
`ORDERFLOW_HUB`, `ORDERFLOW_STORE_URL` and `ORDERFLOW_RABBITMQ_URL` for one command."""


def _unit(name: str) -> str | None:
    return next((unit for end, unit in UNITS.items() if name.endswith(end)), None)


def _type(name: str, field: FieldInfo) -> str:
    annotation: Any = field.annotation
    optional = get_origin(annotation) in (Union, types.UnionType) and type(None) in get_args(
        annotation
    )
    if optional:
        annotation = next(arg for arg in get_args(annotation) if arg is not type(None))
    kind = TYPES.get(annotation, getattr(annotation, "__name__", str(annotation)))
    unit = _unit(name)
    words = [f"{kind} ({unit})" if unit else kind]
    for rule in field.metadata:
        for bound, (attribute, phrase) in BOUNDS.items():
            if isinstance(rule, bound):
                words.append(phrase.format(getattr(rule, attribute)))
        pattern = getattr(rule, "pattern", None)
        if pattern:
            words.append(f"matching {code(pattern)}")
    if optional:
        words.append("or unset")
    return ", ".join(words)


def _duration(seconds: float) -> str:
    for size, unit in ((86400, "day"), (3600, "hour"), (60, "minute")):
        if seconds >= size and seconds % size == 0:
            count = seconds / size
            return f" ({count:g} {unit}{'' if count == 1 else 's'})"
    return ""


def _default(name: str, field: FieldInfo) -> str:
    default = field.default
    if default is None:
        return "unset"
    if default == "":
        return "empty"
    if isinstance(default, bool):
        return code(str(default).lower())
    shown = code(str(default))
    if _unit(name) == "seconds" and isinstance(default, int | float):
        shown += _duration(float(default))
    return shown


def _setting(name: str, field: FieldInfo) -> list[str]:
    variable = f"ORDERFLOW_{name.upper()}"
    facts = [f"- Type: {_type(name, field)}", f"- Default: {_default(name, field)}"]
    if name in SET_BY_COMPOSE:
        compose = inline(SET_BY_COMPOSE[name])
        facts.append(f"- In the compose deployment: set by `docker-compose.yml` ({compose})")
    return [f"### {code(variable)}", inline(field.description or ""), "\n".join(facts)]


def _heading(model: type[Section]) -> str:
    """A section's heading: its docstring's first sentence, up to a colon."""
    text = " ".join((model.__doc__ or "").split())
    return text.split(". ")[0].split(": ")[0].rstrip(".")


def _section(key: str, model: type[Section]) -> list[str]:
    source = inspect.getfile(model).rpartition("/shared/")[2]
    where = (
        f"Section `Settings.{key}`: `{model.__name__}` in `shared/{source}`."
        if key != "hub"
        else f"`Settings.hub`, read by `{model.__name__}` in `shared/{source}`."
    )
    heading, doc = _heading(model), inline(model.__doc__ or "")
    blocks = [f"## {inline(heading)}", "" if doc == f"{inline(heading)}." else doc, where]
    for name, field in model.model_fields.items():
        blocks += _setting(name, field)
    return blocks


def _others() -> list[str]:
    rows = [
        f"- {code(variable)}: {inline(what)}" for variable, what in sorted(NOT_SETTINGS.items())
    ]
    return [
        "## Other variables",
        "Read by orderflow, but no setting (not in `.env.example`):",
        "\n".join(rows),
    ]


def configuration_page() -> str:
    """The page's Markdown."""
    blocks = [
        "# Configuration reference",
        "Generated from the settings (`shared/config/`) by `orderflow deploy write`: edit the "
        "settings' docstrings, not this page.",
        " ".join(INTRO.split()),
    ]
    for key, model in SECTIONS.items():
        blocks += _section(key, model)
    return document(blocks + _others())
