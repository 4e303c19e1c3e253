"""The strict JSON reader and the storable-value rule (shared/domain/jsonsafe.py)."""

from __future__ import annotations

import contextlib
import json

import pytest
from hypothesis import given

from shared.domain.jsonsafe import MAX_DEPTH, parse, storable, storable_problem
from shared.errors import MalformedMessage
from tests.support.bodies import json_values


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (b"\xff{}", "not UTF-8"),
        (b"\xef\xbb\xbf{}", "byte order mark"),
        (b'{"a": 1, "a": 2}', "duplicate key"),
        (b'{"a": NaN}', "NaN"),
        (b'{"a": -Infinity}', "Infinity"),
        (b'{"a": 1e400}', "out of range"),
        (b'{"a": ' + b"1" * 5000 + b"}", "4,300 digits"),
        (b'[{"a": ' + b"1" * 5000 + b"}]", "4,300 digits"),
        (b"[" * (MAX_DEPTH + 1) + b"]" * (MAX_DEPTH + 1), "nested deeper"),
        (b"[" * 200_000, "nested deeper"),
        (b'["\\ud800"]', "surrogate"),
        (b'{"\\udfff": 1}', "surrogate"),
        (b"{", "not JSON"),
    ],
)
def test_parse_refuses_with_the_reason(body: bytes, says: str) -> None:
    with pytest.raises(MalformedMessage, match=says):
        parse(body)


def test_an_integer_past_64_bits_is_read_and_then_not_storable() -> None:
    value = parse(b'{"a": ' + b"1" * 21 + b"}")
    assert storable_problem(value) is not None


def test_parse_reads_ordinary_json() -> None:
    doc = {"a": [1, -2, 2.5, "Zoë", None, True], "b": {"c": "\u00e9"}, "n": 2**63 - 1}
    assert parse(json.dumps(doc).encode()) == doc
    assert parse(b"[" * MAX_DEPTH + b"]" * MAX_DEPTH) is not None


@given(json_values)
def test_parse_is_total_over_any_json_document(value: object) -> None:
    body = json.dumps(value).encode()
    with contextlib.suppress(MalformedMessage):
        parse(body)


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ({"a": "x\x00y"}, "NUL"),
        ({"a\x00": 1}, "NUL"),
        ({"$set": 1}, "'\\$'"),
        ({"a.b": 1}, "'.'"),
        ({"": 1}, "empty"),
        ({"a": 2**63}, "64 bits"),
        ({"a": -(2**63) - 1}, "64 bits"),
        ({"a": float("inf")}, "finite"),
        ({"a": float("nan")}, "finite"),
        ({"a": {"b": [{"c": "\ud800"}]}}, "a.b\\[0\\].c"),
        ({"a": object()}, "not JSON"),
    ],
)
def test_storable_refuses_what_a_store_cannot_hold(value: object, says: str) -> None:
    assert storable_problem(value) is not None
    with pytest.raises(ValueError, match=says):
        storable(value)


def test_storable_accepts_what_both_stores_hold() -> None:
    value = {"a": [1, 2.5, "x\ny", None, False], "b": {"c": -(2**63)}, "é": "\u202e"}
    assert storable(value) is value
