"""JSON from strangers: one strict parser, and the values a store can hold. Pure: no I/O.

Any byte string at all may arrive as a message body. `parse` reads it or raises
`MalformedMessage` with the reason, and nothing else: it refuses what JSON parsers disagree
on or what no store can hold, before a contract is validated.

| refused                                  | why                                                  |
|------------------------------------------|------------------------------------------------------|
| bytes that are not UTF-8 (or carry a BOM) | RFC 8259 §8.1; another parser would read other text  |
| duplicate keys in one object             | parsers disagree on which one wins (RFC 8259 §4)     |
| `NaN`, `Infinity`, a float that overflows | not JSON; no `jsonb` can hold them                  |
| an integer of more than 4,300 digits     | Python refuses to read it (64 bits: `storable`)      |
| nesting deeper than `MAX_DEPTH`          | recursion in every reader and writer after this one  |
| an unpaired surrogate (`"\\ud800"`)      | not Unicode: no driver can encode it                 |

`storable` is the validator of the free-form JSON fields of contracts (a step's payload and
result, an alert's data): what both stores hold identically (no NUL in strings or keys, no key
that MongoDB reads as an operator or a path, integers within 64 bits, finite floats).
"""

from __future__ import annotations

import json
import math
from typing import Any

from shared.errors import MalformedMessage

MAX_DEPTH = 32
"""Nesting of arrays and objects a body may have (a contract needs six)."""
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


class _Refused(Exception):
    """Raised inside the parser's hooks; becomes `MalformedMessage` in `parse`."""


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result = dict(pairs)
    if len(result) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _Refused(f"duplicate key {key[:40]!r} in one object")
            seen.add(key)
    return result


def _float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _Refused(f"the number {text[:40]} is out of range")
    return value


def _constant(name: str) -> Any:
    raise _Refused(f"{name} is not JSON")


# No hook for integers: it would run for every one of them. Python itself refuses one of more
# than 4,300 digits (ValueError); 64 bits is the rule of `storable` and of each field's bounds.
_DECODER = json.JSONDecoder(object_pairs_hook=_object, parse_float=_float, parse_constant=_constant)


def parse(body: bytes) -> Any:
    """The JSON value of `body`, or `MalformedMessage` saying why it is refused."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise MalformedMessage(f"body is not UTF-8 (byte {exc.start}: {exc.reason})") from None
    if text.startswith("\ufeff"):
        raise MalformedMessage("body starts with a byte order mark (RFC 8259 §8.1 forbids it)")
    try:
        value = _DECODER.decode(text)
    except _Refused as exc:
        raise MalformedMessage(f"body refused: {exc}") from None
    except json.JSONDecodeError as exc:
        raise MalformedMessage(f"body is not JSON: {exc.msg} at offset {exc.pos}") from None
    except ValueError:  # the only other one: Python's limit on an integer's digits
        raise MalformedMessage("body refused: an integer of more than 4,300 digits") from None
    except RecursionError:
        raise MalformedMessage(f"body is nested deeper than {MAX_DEPTH} levels") from None
    if _may_be_deep_or_surrogate(body):
        problem = _shape_problem(value)
        if problem is not None:
            raise MalformedMessage(f"body refused: {problem}")
    return value


def _may_be_deep_or_surrogate(body: bytes) -> bool:
    """Whether the walk of `_shape_problem` can find anything: a tree with no more arrays and
    objects than `MAX_DEPTH` is not that deep, and a surrogate in valid UTF-8 can only come from
    a `\\u` escape. Counted in C, so an ordinary message is not walked in Python at all."""
    if b"\\ud" in body or b"\\uD" in body:
        return True
    return body.count(b"[") + body.count(b"{") > MAX_DEPTH


def _shape_problem(value: Any) -> str | None:
    """Depth and surrogates, checked without recursion (the tree may be deep)."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict | list):
            if depth >= MAX_DEPTH:
                return f"nested deeper than {MAX_DEPTH} levels"
            children: list[Any] = list(node.values() if isinstance(node, dict) else node)
            if isinstance(node, dict) and any(_has_surrogate(key) for key in node):
                return "a key holds an unpaired surrogate (not Unicode)"
            stack.extend((child, depth + 1) for child in children)
        elif isinstance(node, str) and _has_surrogate(node):
            return "a string holds an unpaired surrogate (not Unicode)"
    return None


def _has_surrogate(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def storable_problem(value: Any) -> str | None:
    """Why `value` (parsed JSON) cannot be stored alike by every store, or None."""
    stack: list[tuple[Any, int, str]] = [(value, 0, "")]
    while stack:
        node, depth, where = stack.pop()
        if depth > MAX_DEPTH:
            return f"{where or 'value'}: nested deeper than {MAX_DEPTH} levels"
        if isinstance(node, dict):
            for key, child in node.items():
                problem = _key_problem(key)
                if problem is not None:
                    return f"{where or 'value'}: {problem}"
                stack.append((child, depth + 1, f"{where}.{key}" if where else str(key)))
        elif isinstance(node, list):
            stack.extend((child, depth + 1, f"{where}[{i}]") for i, child in enumerate(node))
        else:
            problem = _scalar_problem(node)
            if problem is not None:
                return f"{where or 'value'}: {problem}"
    return None


def _scalar_problem(node: object) -> str | None:
    if isinstance(node, bool) or node is None:
        return None
    if isinstance(node, int):
        return None if INT64_MIN <= node <= INT64_MAX else "integer beyond 64 bits"
    if isinstance(node, float):
        return None if math.isfinite(node) else f"{node} is not a finite number"
    if isinstance(node, str):
        bad = "\x00" in node or _has_surrogate(node)
        return "holds NUL or an unpaired surrogate" if bad else None
    return f"{type(node).__name__} is not JSON"


def _key_problem(key: object) -> str | None:
    if not isinstance(key, str):
        return "a key is not a string"
    if not key or len(key) > 200:
        return "a key is empty or longer than 200 characters"
    if "\x00" in key or _has_surrogate(key):
        return "a key holds NUL or an unpaired surrogate"
    if key.startswith("$") or "." in key:
        # MongoDB reads `$x` as an operator and `a.b` as a path in updates.
        return f"the key {key[:40]!r} starts with '$' or holds '.'"
    return None


def storable(value: Any) -> Any:
    """A pydantic after-validator: `value` unchanged, or ValueError saying what no store holds."""
    problem = storable_problem(value)
    if problem is not None:
        raise ValueError(problem)
    return value
