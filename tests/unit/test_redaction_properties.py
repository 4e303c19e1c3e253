"""Redaction searched by hypothesis: a card number put anywhere in any JSON, or in any AMQP
header table, never survives; redacting twice masks nothing more; data that holds no card
number and no sensitive name is kept byte for byte; and no input makes it fail.

Card numbers are generated, not sampled: any 12 to 19 digits completed with their Luhn check
digit, written plain or in groups split by spaces or dashes.
"""

from __future__ import annotations

import json
import re
from typing import Any

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from shared.domain.redaction import redact_body, redact_text
from tests.support.bodies import hostile_messages, json_values
from tests.support.cards import card_digits, prefixes, suffixes, with_check_digit, written


@st.composite
def card_item(draw: st.DrawFn) -> tuple[str, Any, bool]:
    """(the card's digits, a JSON value holding it, whether it is to be used as a key)."""
    digits = draw(card_digits)
    how = draw(st.sampled_from(["key", "string", "int", "float"]))
    if how in ("int", "float") and digits[0] != "0":
        number = int(digits) * draw(st.sampled_from([1, -1]))
        if how == "int" or abs(number) >= 10**16 or float(number) != number:
            return digits, number, False  # JSON writes a larger float with an exponent
        return digits, float(number), False
    text = draw(prefixes) + draw(written(digits)) + draw(suffixes)
    return digits, text, how == "key"


def _containers(doc: Any) -> list[Any]:
    found = [doc] if isinstance(doc, dict | list) else []
    children = doc.values() if isinstance(doc, dict) else doc if isinstance(doc, list) else []
    for child in children:
        found += _containers(child)
    return found


@st.composite
def docs_with_a_card(draw: st.DrawFn) -> tuple[str, bytes, Any]:
    """Any JSON document with a card number put somewhere in it: (its digits, the document
    before, the document)."""
    doc = {"wrapped": draw(json_values)}
    before = dump(doc)
    digits, item, as_key = draw(card_item())
    target = draw(st.sampled_from(_containers(doc)))
    if as_key:
        dicts = [c for c in _containers(doc) if isinstance(c, dict)]
        under_key = draw(json_values)
        before += b" " + dump(under_key)
        draw(st.sampled_from(dicts))[item] = under_key
    elif isinstance(target, dict):
        # A new key: one that replaced a value would take away the digits it held (a hypothesis
        # finding: {"": [3814697265625000000000000]} became {"": "000000000000"}).
        target[draw(st.text(max_size=8).filter(lambda k: k not in target))] = item
    else:
        target.insert(draw(st.integers(0, len(target))), item)
    return digits, before, doc


def dump(doc: Any) -> bytes:
    return json.dumps(doc, allow_nan=True).encode()


def shown(digits: str, body: bytes) -> int:
    """How often `digits` show in the body, in any grouping (spaces and dashes dropped)."""
    return re.sub(r"[ -]", "", body.decode("utf-8", "surrogateescape")).count(digits)


# The document may show the same digits by chance (a power of ten holds 000000000000): the card
# number is gone when they show no more often than before it was put in.


# A hypothesis finding: a key holding a written backslash, `u` and a card number; read as a JSON
# escape, `\u0000` hid four of its digits from the masking.
ESCAPE_LOOKALIKE = (
    "000000000000",
    b'{"wrapped": null} null',
    {"wrapped": None, "\\u000000000000": None},
)


@given(docs_with_a_card())
@example(ESCAPE_LOOKALIKE)
@settings(max_examples=500, suppress_health_check=[HealthCheck.too_slow])
def test_a_card_number_anywhere_in_any_json_never_survives(case: tuple[str, bytes, Any]) -> None:
    digits, before, doc = case
    body = dump(doc)
    assert shown(digits, body) > shown(digits, before)  # the generator put it there
    masked, changed = redact_body(body)
    assert changed and shown(digits, masked) <= shown(digits, before)


@given(docs_with_a_card())
@example(ESCAPE_LOOKALIKE)
@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
def test_a_card_number_in_a_body_cut_short_never_survives(case: tuple[str, bytes, Any]) -> None:
    # Without its last brace (the wrapper's): not JSON, so masked as text.
    digits, before, doc = case
    masked, _ = redact_body(dump(doc)[:-1])
    assert shown(digits, masked) <= shown(digits, before)


@given(
    st.one_of(
        docs_with_a_card().map(lambda case: dump(case[2])),
        hostile_messages().map(lambda message: message[1]),
    )
)
@settings(max_examples=500, suppress_health_check=[HealthCheck.too_slow])
def test_redacting_a_redacted_body_changes_nothing(body: bytes) -> None:
    once, _ = redact_body(body)
    assert redact_body(once) == (once, False)


# -- data with nothing to mask: no sensitive name can be spelt without c, e, i, n, p or v
plain_names = st.text(
    alphabet="abdfghjklmoqrstuwxyzABDFGHJKLMOQRSTUWXYZ_-. 0123456789", max_size=10
)
_LONG_RUN = re.compile(r"\d(?:[ -]?\d){11}")
plain_text = st.text().filter(lambda s: '"' not in s and not _LONG_RUN.search(s))
plain_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**11) + 1, 10**11 - 1),
    st.integers(min_value=10**19, max_value=10**30),  # too long to be a card number
    st.floats().filter(lambda x: not abs(x) >= 10**11 or x != x or abs(x) == float("inf")),
    plain_text,
)
plain_json = st.recursive(
    plain_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(plain_names, inner, max_size=4),
    max_leaves=16,
)


@given(st.lists(plain_json) | st.dictionaries(plain_names, plain_json))
@settings(max_examples=500)
def test_a_body_without_payment_details_is_kept_byte_for_byte(doc: Any) -> None:
    # (A body that is a bare number or string is read as text, where a digit run is a digit
    # run: "1.5958761691080863e-107" holds a Luhn-valid one.)
    body = dump(doc)
    assert redact_body(body) == (body, False)


@given(st.one_of(json_values.map(dump), hostile_messages().map(lambda message: message[1])))
@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
def test_redact_body_is_total(body: bytes) -> None:
    masked, changed = redact_body(body)
    assert isinstance(masked, bytes) and isinstance(changed, bool)
    assert changed or masked is body


# -- the search for card numbers among digit groups, against brute force


def luhn(digits: str) -> bool:
    return with_check_digit(digits[:-1]) == digits


def masked_by_brute_force(run: str) -> str:
    """Every window of whole groups tried; windows that share a group masked as one."""
    parts = re.split(r"([ -])", run)
    groups = parts[::2]
    if 12 <= len("".join(groups)) <= 19 and luhn("".join(groups)):
        return "[redacted card number]"
    windows = [
        (first, last)
        for first in range(len(groups))
        for last in range(first, len(groups))
        if 12 <= len(digits := "".join(groups[first : last + 1])) <= 19 and luhn(digits)
    ]
    merged: list[tuple[int, int]] = []
    for first, last in windows:  # in order of their first group
        if merged and merged[-1][1] >= first:
            merged[-1] = (merged[-1][0], max(merged[-1][1], last))
        else:
            merged.append((first, last))
    out, kept_from = [], 0
    for first, last in merged:
        out += [*parts[kept_from : 2 * first], "[redacted card number]"]
        kept_from = 2 * last + 1
    return "".join(out + parts[kept_from:])


@st.composite
def digit_runs(draw: st.DrawFn) -> str:
    groups = draw(st.lists(st.text("0123456789", min_size=1, max_size=6), min_size=1, max_size=12))
    if draw(st.booleans()):  # a card number among them, in groups of its own
        at = draw(st.integers(0, len(groups)))
        groups[at:at] = draw(written(draw(card_digits))).replace("-", " ").split(" ")
    seps = draw(st.lists(st.sampled_from(" -"), min_size=len(groups), max_size=len(groups)))
    return "".join(g + s for g, s in zip(groups, seps, strict=True))[:-1]


@given(digit_runs())
@settings(max_examples=1000)
def test_card_numbers_among_digit_groups_are_found_as_brute_force_finds_them(run: str) -> None:
    assert redact_text(run) == masked_by_brute_force(run)


def test_the_generator_never_takes_away_digits_it_did_not_put_there() -> None:
    """The regression of the finding above, as an example: a card put beside a value that
    holds the same digits by chance is masked, and the chance digits stay."""
    body = b'{"wrapped": {"": [3814697265625000000000000], "k": "000000000000"}}'
    masked, changed = redact_body(body)
    assert changed and shown("000000000000", masked) == 1
