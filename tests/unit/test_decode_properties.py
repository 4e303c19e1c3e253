"""`decode` is total: any type and any body decode, or raise one `ContractViolation` with a
reason — searched by hypothesis over every class of hostile input (tests/support/bodies.py).

And what runs on a refused body afterwards is total too: redaction of its dead letter, the
log line about it. Examples the search found, or that the intake issue lists, are pinned with
`@example` so they are tried on every run.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from shared.domain import jsonsafe
from shared.domain.messages import Contract, decode
from shared.domain.redaction import redact_body
from shared.domain.text import unsafe_characters
from shared.errors import ContractViolation, UndecodableMessage
from tests.fuzz import decode_check
from tests.support.bodies import (
    SAMPLES,
    TYPES,
    hostile_messages,
    sample_contracts,
    valid_orders,
)

LIMIT = 64 * 1024
REASONS = {
    "malformed",
    "invalid",
    "unknown-type",
    "unsupported-schema-version",
    "too-large",
}
"""Every reason decode may give: a closed set, so a metric labelled by it stays bounded."""

ISSUE_EXAMPLES = [
    ("order.submit", b"[" * 100_000 + b"]" * 100_000),  # deeper than any recursion limit
    ("order.submit", b'{"a":' * 500 + b"1" + b"}" * 500),
    ("order.submit", b'{"schema_version": [1]}'),  # unhashable where a scalar is expected
    ("order.submit", b'{"schema_version": {"v": 1}}'),
    ("order.submit", b'{"schema_version": true}'),  # equal to 1 in Python
    ("order.submit", b'{"schema_version": 1.0}'),
    ("order.submit", b'{"schema_version": 1' + b"9" * 5000 + b"}"),  # Python's digit limit
    ("step.reply", b'{"schema_version": 1, "x": ' + b"9" * 4301 + b"}"),
    ("order.submit", b'{"schema_version": 1, "x": 1e999}'),
    ("order.submit", b'{"schema_version": NaN}'),
    ("order.submit", b'{"schema_version": 1, "schema_version": 2}'),
    ("order.submit", b'{"schema_version": 1, "order": "\\ud800"}'),
    ("order.submit", b'\xef\xbb\xbf{"schema_version": 1}'),
    ("order.submit", '{"schema_version": 1}'.encode("utf-16")),
    ("order.submit", b'{"schema_version": 1, "x": "\xff"}'),
    ("order.submit", b'{"schema_version": 1, "x": "\x00\x1b"}'),
    ("no.such\x00type", b"{}"),
    (None, b""),
]


def _outcome(type_name: str | None, body: bytes) -> Contract | ContractViolation:
    try:
        return decode(type_name, body, max_bytes=LIMIT)
    except ContractViolation as exc:
        return exc


def _every_example(test):  # type: ignore[no-untyped-def]
    for type_name, body in ISSUE_EXAMPLES:
        test = example((type_name, body))(test)
    return test


@_every_example
@given(hostile_messages())
@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
def test_decode_returns_a_contract_or_raises_a_contract_violation(
    message: tuple[str | None, bytes],
) -> None:
    type_name, body = message
    outcome = _outcome(type_name, body)  # any other exception fails the test
    if isinstance(outcome, ContractViolation):
        # Refused by a check that foresaw it, not by decode's last-resort net.
        assert not isinstance(outcome, UndecodableMessage), outcome
        assert outcome.reason in REASONS
        assert str(outcome)
        assert not unsafe_characters(str(outcome)), "the reason quotes unsafe text"
    else:
        # What decodes is storable and displayable, and survives its own round trip.
        again = decode(outcome.message_type.value, outcome.to_json(), max_bytes=LIMIT)
        assert again == outcome
        assert jsonsafe.storable_problem(outcome.model_dump(mode="json")) is None


@given(st.sampled_from(TYPES), st.binary(max_size=2048))
def test_any_bytes_decode_or_are_refused(type_name: str, body: bytes) -> None:
    outcome = _outcome(type_name, body)
    assert not isinstance(outcome, UndecodableMessage)


@_every_example
@given(hostile_messages())
@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
def test_redacting_the_dead_letter_of_any_body_never_fails(
    message: tuple[str | None, bytes],
) -> None:
    _, body = message
    redacted, _ = redact_body(body)
    assert isinstance(redacted, bytes)


@_every_example
@given(hostile_messages())
@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
def test_the_log_line_about_any_refused_body_is_one_ascii_json_line(
    message: tuple[str | None, bytes],
) -> None:
    type_name, body = message
    # The same check the fuzzer runs (one ASCII line of JSON, the event named).
    decode_check._check_log_line(type_name, body, _outcome(type_name, body))


@given(valid_orders())
def test_every_valid_order_decodes_as_sent(order) -> None:  # type: ignore[no-untyped-def]
    sample = sample_contracts()[0]
    message = sample.model_copy(update={"order": order})
    assert decode("order.submit", message.to_json(), max_bytes=LIMIT) == message


@pytest.mark.parametrize("contract", sample_contracts(), ids=lambda c: c.message_type.value)
def test_the_samples_decode(contract: Contract) -> None:
    assert decode(contract.message_type.value, contract.to_json(), max_bytes=LIMIT) == contract
    assert SAMPLES[contract.message_type.value] == contract.model_dump(mode="json")
