"""docs/reference/http-api.md: the HTTP API from its OpenAPI document (docs/openapi.json, which
the API builds from the models that validate each request): each path and method with what it
does, who may call it, its parameters, its body and its answers. The schemas themselves stay in
the JSON, which the page links to."""

from __future__ import annotations

import json
from typing import Any

from deployment.reference.markdown import code, document, inline, paragraphs

DOCUMENT = "../openapi.json"
"""The OpenAPI document, relative to docs/reference/."""

METHODS = ("get", "put", "post", "delete", "patch", "head", "options")
CONSTRAINTS = {
    "minimum": "at least {}",
    "exclusiveMinimum": "more than {}",
    "maximum": "at most {}",
    "exclusiveMaximum": "less than {}",
    "minLength": "length at least {}",
    "maxLength": "length at most {}",
    "minItems": "items at least {}",
    "maxItems": "items at most {}",
}

Operation = tuple[str, str, dict[str, Any]]


def operations(api: dict[str, Any]) -> list[Operation]:
    """Every (path, method, operation) of the document, in its order."""
    return [
        (path, method, item[method])
        for path, item in api["paths"].items()
        for method in METHODS
        if method in item
    ]


def schema_text(schema: dict[str, Any]) -> str:
    """A schema in a few words: a named one by its name, else its type and bounds."""
    if "$ref" in schema:
        return code(schema["$ref"].rpartition("/")[2])
    if "anyOf" in schema:
        kinds = [s for s in schema["anyOf"] if s.get("type") != "null"]
        text = " or ".join(schema_text(s) for s in kinds)
        return text + (", or null" if len(kinds) < len(schema["anyOf"]) else "")
    if schema.get("type") == "array":
        return f"array of {schema_text(schema.get('items', {}))}"
    words = [str(schema.get("type", "any"))]
    if "enum" in schema:
        words.append("one of " + ", ".join(code(json.dumps(v)) for v in schema["enum"]))
    words += [text.format(schema[key]) for key, text in CONSTRAINTS.items() if key in schema]
    if "pattern" in schema:
        words.append(f"matching {code(schema['pattern'])}")
    return ", ".join(words)


def _content(content: dict[str, Any]) -> str:
    return "; ".join(
        f"{code(media)}" + (f": {schema_text(body['schema'])}" if body.get("schema") else "")
        for media, body in content.items()
    )


def _response(code_: str, response: dict[str, Any]) -> str:
    content = response.get("content")
    body = f" ({_content(content)})" if content else ""
    return f"- {code_}: {inline(response.get('description', ''))}{body}"


def _common(api: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The answers every operation documents alike (the refusals of every endpoint)."""
    answers = [op["responses"] for _, _, op in operations(api)]
    return {
        code_: response
        for code_, response in answers[0].items()
        if all(other.get(code_) == response for other in answers[1:])
    }


def _auth(api: dict[str, Any], operation: dict[str, Any]) -> str:
    security = operation.get("security", api.get("security", []))
    if not security:
        return "Auth: none."
    schemes = api.get("components", {}).get("securitySchemes", {})
    described = []
    for requirement in security:
        for name in requirement:
            scheme = schemes.get(name, {})
            kind = " ".join(str(scheme.get(k, "")) for k in ("type", "scheme")).strip()
            described.append(f"{code(name)} ({kind}): {inline(scheme.get('description', ''))}")
    return "Auth: " + "; or ".join(described)


def _parameter(parameter: dict[str, Any]) -> str:
    words = [
        f"{code(parameter['name'])} ({parameter['in']}, "
        f"{'required' if parameter.get('required') else 'optional'}): "
        f"{schema_text(parameter.get('schema', {}))}"
    ]
    default = parameter.get("schema", {}).get("default")
    if default is not None:
        words.append(f"default {code(json.dumps(default))}")
    text = "- " + "; ".join(words)
    if parameter.get("description"):
        text += f". {inline(parameter['description'])}"
    return text


def _operation(api: dict[str, Any], common: dict[str, Any], operation: Operation) -> list[str]:
    path, method, op = operation
    blocks = [f"### {code(f'{method.upper()} {path}')}"]
    if op.get("summary"):
        blocks.append(f"**{inline(op['summary'])}**")
    blocks += paragraphs(op.get("description", ""))
    blocks.append(_auth(api, op))
    if op.get("parameters"):
        blocks += ["Parameters:", "\n".join(_parameter(p) for p in op["parameters"])]
    body = op.get("requestBody")
    if body:
        required = "required" if body.get("required") else "optional"
        blocks.append(f"Request body ({required}): {_content(body.get('content', {}))}")
    own = {c: r for c, r in op["responses"].items() if c not in common}
    listed = "\n".join(_response(c, r) for c, r in own.items())
    blocks += ["Responses (and every endpoint's refusals):", listed]
    return blocks


def _schemas(api: dict[str, Any]) -> list[str]:
    rows = []
    for name, schema in api.get("components", {}).get("schemas", {}).items():
        facts = [inline(schema.get("description", "").split("\n\n")[0])]
        if "enum" in schema:
            facts.append("one of " + ", ".join(code(json.dumps(v)) for v in schema["enum"]))
        if "properties" in schema:
            facts.append("fields " + ", ".join(code(field) for field in schema["properties"]))
        rows.append(f"- {code(name)}: " + "; ".join(f for f in facts if f))
    return [
        "## Schemas",
        f"Each body's schema is in [the OpenAPI document]({DOCUMENT}), under `components.schemas`:",
        "\n".join(rows),
    ]


def http_api_page(openapi: str) -> str:
    """The page's Markdown, from the OpenAPI document's text."""
    api = json.loads(openapi)
    info = api.get("info", {})
    common = _common(api)
    blocks = [
        "# HTTP API reference",
        f"Generated from [the OpenAPI document]({DOCUMENT}) (`docs/openapi.json`, which the API "
        "builds from its models) by `orderflow deploy write`: edit the API, not this page. "
        f"{inline(info.get('title', ''))}, version {code(str(info.get('version', '')))}.",
        *paragraphs(info.get("description", "")),
        "## Every endpoint's refusals",
        "\n".join(_response(c, r) for c, r in common.items()),
    ]
    tags = sorted({tag for _, _, op in operations(api) for tag in op.get("tags", ["other"])})
    for tag in tags:
        blocks.append(f"## {inline(tag.capitalize())}")
        for operation in operations(api):
            if tag in operation[2].get("tags", ["other"]):
                blocks += _operation(api, common, operation)
    return document(blocks + _schemas(api))
