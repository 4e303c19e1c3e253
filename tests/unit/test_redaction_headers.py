"""A dead letter's copy of the sender's AMQP headers has payment details masked, like its body.

pamqp hands a header table over as a dict of str, bytes (a long string that is not UTF-8),
bytearray, int, float, Decimal, bool, None, datetime, nested tables and lists: every one of
them must come back as something pamqp can encode again.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pamqp import decode, encode

from shared.domain.redaction import CARD_MARK, MARK, redact_headers
from tests.unit.test_redaction_properties import card_digits, prefixes, suffixes, written

VISA = "4111111111111111"


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (f"card {VISA}", f"card {CARD_MARK}"),
        (f"card {VISA}".encode(), f"card {CARD_MARK}".encode()),
        (b"\xff\xfe " + VISA.encode() + b" \x80", b"\xff\xfe " + CARD_MARK.encode() + b" \x80"),
        (bytearray(VISA.encode()), bytearray(CARD_MARK.encode())),
        (int(VISA), CARD_MARK),  # no integer can carry the marker: it becomes text
        (-int(VISA), CARD_MARK),
        (float(VISA), CARD_MARK),
        (Decimal(VISA), CARD_MARK),
        ({"payment": {"note": VISA}}, {"payment": {"note": CARD_MARK}}),
        (["a", int(VISA), [VISA]], ["a", CARD_MARK, [CARD_MARK]]),
        ('{"cvv": "737"}', f'{{"cvv": "{MARK}"}}'),
    ],
)
def test_card_numbers_in_header_values_are_masked(value: Any, expected: Any) -> None:
    masked, changed = redact_headers({"x-note": value})
    assert changed
    assert masked == {"x-note": expected}
    assert type(masked["x-note"]) is type(expected)


@pytest.mark.parametrize(
    ("name", "value", "expected"),
    [
        ("x-card-cvv", 737, MARK),
        ("CardNumber", VISA, MARK),
        ("x-pan", b"\xff" + VISA.encode(), MARK.encode()),  # bytes stay bytes
        ("x-card-pin", bytearray(b"1234"), bytearray(MARK.encode())),
        ("x-security-code", {"a": 1}, MARK),
        ("x-expiry", None, MARK),
    ],
)
def test_values_under_sensitive_names_are_masked(name: str, value: Any, expected: Any) -> None:
    masked, changed = redact_headers({name: value, "x-kept": "a"})
    assert changed and masked == {name: expected, "x-kept": "a"}
    assert type(masked[name]) is type(expected)


def test_sensitive_names_in_nested_tables_and_lists() -> None:
    headers = {"x-meta": {"payment": [{"cvvCode": b"737", "brand": "visa"}]}}
    masked, changed = redact_headers(headers)
    assert changed and masked == {
        "x-meta": {"payment": [{"cvvCode": MARK.encode(), "brand": "visa"}]}
    }


def test_a_card_number_in_a_header_name_is_masked_with_its_value() -> None:
    masked, changed = redact_headers({f"x-{VISA}": "12/27", f"x-{VISA[:-1]}9": "kept"})
    assert changed
    assert masked == {f"x-{CARD_MARK}": MARK, f"x-{VISA[:-1]}9": "kept"}


def test_clean_headers_are_an_equal_copy_and_say_so() -> None:
    headers: dict[str, Any] = {
        "x-death": [{"count": 1, "queue": "q", "original-expiration": "1000"}],
        "x-id": "o-1",
        "n": 1764590400000,
        "f": 2.5,
        "raw": b"\xff\xfe",
        "t": datetime(2026, 12, 1, tzinfo=UTC),
        "b": True,
        "none": None,
    }
    masked, changed = redact_headers(headers)
    assert not changed and masked == headers and masked is not headers


def test_what_pamqp_decoded_it_can_encode_again_after_redaction() -> None:
    headers = {
        "a": VISA,
        "b": int(VISA),
        "c": {"cvv": 737, "l": [VISA, 1.5, True, None, Decimal("1.5")]},
        "d": bytearray(b"x" + VISA.encode()),
        "e": datetime(2026, 12, 1, tzinfo=UTC),
    }
    wire = encode.field_table(headers)
    _, decoded = decode.field_table(wire)
    masked, changed = redact_headers(decoded)
    assert changed
    _, again = decode.field_table(encode.field_table(masked))
    assert VISA not in repr(again) and "737" not in repr(again)


def test_redacting_headers_twice_changes_nothing_more() -> None:
    once, _ = redact_headers({VISA: 1, f"x-{VISA}": 2, "x-cvv": 3, "n": [int(VISA)]})
    assert redact_headers(once) == (once, False)


def test_redact_headers_is_total_on_what_no_wire_carries() -> None:
    cycle: dict[str, Any] = {"note": VISA}
    cycle["self"] = cycle
    shared: dict[str, Any] = {"x": VISA}
    for _ in range(200):  # each level twice: 2**200 paths, if walked naively
        shared = {"a": shared, "b": shared}
    deep: Any = VISA
    for _ in range(10_000):
        deep = [deep]
    odd = object()
    headers = {
        "cycle": cycle,
        "shared": shared,
        "deep": deep,
        "huge": 10**5000,
        "nan": float("nan"),
        "dnan": Decimal("NaN"),
        "snan": Decimal("sNaN"),
        "dhuge": Decimal("1E+999999"),
        "odd": odd,
        "t": (VISA,),
    }
    masked, changed = redact_headers(headers)
    assert changed
    assert masked["odd"] is odd and masked["huge"] == 10**5000
    assert VISA not in repr(masked["cycle"])[:10_000] and VISA not in repr(masked["deep"])


# -- searched by hypothesis: any table pamqp could hand over

_names = st.text(max_size=12)
_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(allow_nan=True, allow_infinity=True),
    st.decimals(allow_nan=False, allow_infinity=False, places=2, max_value=10**6),
    st.text(),
    st.binary(max_size=40),
    st.binary(max_size=20).map(bytearray),
    st.datetimes(timezones=st.just(UTC)).map(lambda t: t.replace(microsecond=0)),
)
header_values = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_names, inner, max_size=4),
    max_leaves=12,
)
tables = st.dictionaries(_names, header_values, max_size=6)


@st.composite
def tables_with_a_card(draw: st.DrawFn) -> tuple[str, str, dict[str, Any]]:
    """(a card number's digits, the table before, the table with the card number somewhere in
    it: in a name, text, bytes or an integer)."""
    digits = draw(card_digits)
    table = draw(tables)
    before = repr(table)
    how = draw(st.sampled_from(["name", "str", "bytes", "int"]))
    text = draw(prefixes) + draw(written(digits)) + draw(suffixes)
    if how == "name":
        table[text] = 1
        return digits, before, table
    item: Any = int(digits) if how == "int" and digits[0] != "0" else text
    item = text.encode() if how == "bytes" else item
    where = draw(st.sampled_from([table, *(v for v in table.values() if isinstance(v, dict))]))
    where[draw(_names)] = item
    return digits, before, table


def _shown(digits: str, text: str) -> int:
    return re.sub(r"[ -]", "", text).count(digits)


@given(tables_with_a_card())
@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
def test_a_card_number_anywhere_in_a_header_table_never_survives(
    case: tuple[str, str, dict[str, Any]],
) -> None:
    digits, before, table = case
    assert _shown(digits, repr(table)) > _shown(digits, before)
    masked, changed = redact_headers(table)
    assert changed and _shown(digits, repr(masked)) <= _shown(digits, before)


def _encodable(table: dict[str, Any]) -> bool:
    try:
        encode.field_table(table)
    except Exception:
        return False
    return True


@given(tables)
@settings(max_examples=500, suppress_health_check=[HealthCheck.too_slow])
def test_redact_headers_is_total_idempotent_and_keeps_what_pamqp_encodes(
    table: dict[str, Any],
) -> None:
    masked, changed = redact_headers(table)
    assert isinstance(masked, dict) and isinstance(changed, bool)
    assert changed or masked == table
    assert redact_headers(masked) == (masked, False)
    if _encodable(table):
        assert _encodable(masked)
