"""What the fuzzer checks on one input, without atheris: `fuzz_decode.py` runs `check` under
the coverage-guided fuzzer, `tests/unit/test_fuzz_regressions.py` replays the kept inputs
(`tests/fuzz/regressions/`) through it on every run of the unit tests.

An input is a message: its first byte chooses the AMQP `type` (`split`), the rest is the body.
`check` raises AssertionError, or lets an unexpected exception through, when the message
breaks what every consumer relies on (shared/domain/messages.decode):

- decode returns a `Contract` or raises a `ContractViolation` with a known reason, whose text
  quotes no unsafe character — and never through its last-resort net (`UndecodableMessage`);
- what decodes survives its own round trip and is storable by every store, and every time in
  it has its offset and a year every store and deadline computation holds (`timing.in_range`);
- the dead letter of the body can be redacted (`redact_body` gives bytes back);
- the log line about it is one ASCII line of JSON.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from datetime import datetime
from typing import Any

from pydantic import BaseModel

from shared.domain import jsonsafe, messages
from shared.domain.messages import Contract, MessageType, decode
from shared.domain.redaction import redact_body
from shared.domain.text import unsafe_characters
from shared.domain.timing import in_range
from shared.errors import ContractViolation, UndecodableMessage
from shared.telemetry import JsonFormatter

LIMIT = 64 * 1024
"""decode's default `max_bytes` (`Settings.broker.max_message_bytes`)."""
REASONS = {"malformed", "invalid", "unknown-type", "unsupported-schema-version", "too-large"}
TYPES = [t.value for t in MessageType]

NONE_TYPE = 200
"""First bytes below this choose one of the real types (byte % 5); from it to `ANY_TYPE` the
message has no type; from `ANY_TYPE` on, the next byte is the length of an arbitrary type
name that follows (read as UTF-8, any invalid byte kept as a lone surrogate)."""
ANY_TYPE = 228

_FORMATTER = JsonFormatter(process="fuzz", hub="h")


def split(data: bytes) -> tuple[str | None, bytes]:
    """The (type, body) of one fuzzer input."""
    if not data:
        return None, b""
    first, rest = data[0], data[1:]
    if first < NONE_TYPE:
        return TYPES[first % len(TYPES)], rest
    if first < ANY_TYPE:
        return None, rest
    size = rest[0] if rest else 0
    return rest[1 : 1 + size].decode("utf-8", "surrogateescape"), rest[1 + size :]


def join(type_name: str | None, body: bytes) -> bytes:
    """The fuzzer input whose `split` is (type_name, body): for the seed corpus."""
    if type_name in TYPES:
        return bytes([TYPES.index(type_name)]) + body
    if type_name is None:
        return bytes([NONE_TYPE]) + body
    name = type_name.encode("utf-8", "surrogateescape")[:255]
    return bytes([ANY_TYPE, len(name)]) + name + body


def check(data: bytes) -> None:
    """Every property, on one fuzzer input."""
    type_name, body = split(data)
    check_message(type_name, body)


def check_message(type_name: str | None, body: bytes) -> None:
    outcome = _decoded(type_name, body)
    if isinstance(outcome, ContractViolation):
        _check_refusal(outcome)
    else:
        _check_contract(outcome)
    _check_redaction(body)
    _check_log_line(type_name, body, outcome)


def _decoded(type_name: str | None, body: bytes) -> Contract | ContractViolation:
    try:
        return decode(type_name, body, max_bytes=LIMIT)
    except UndecodableMessage:
        # The net hides the cause (`from None`); run what it wraps to show the real error.
        try:
            messages._decode(type_name, body, max_bytes=LIMIT)
        except Exception as cause:
            raise AssertionError(f"decode's last-resort net was reached: {cause!r}") from cause
        raise AssertionError("decode's last-resort net was reached, not reproducibly") from None
    except ContractViolation as exc:
        return exc


def _check_refusal(exc: ContractViolation) -> None:
    assert exc.reason in REASONS, exc.reason
    assert str(exc), "a refusal without a text"
    assert not unsafe_characters(str(exc)), f"the reason quotes unsafe text: {str(exc)!r}"


def _check_contract(contract: Contract) -> None:
    wire = contract.to_json()
    again = decode(contract.message_type.value, wire, max_bytes=max(LIMIT, len(wire)))
    assert again == contract, f"the round trip changed it: {wire!r}"
    problem = jsonsafe.storable_problem(contract.model_dump(mode="json"))
    assert problem is None, f"decoded but not storable: {problem}"
    for at in _times(contract):
        assert at.utcoffset() is not None, f"decoded a time without an offset: {at}"
        try:
            in_range(at)
        except ValueError as exc:
            raise AssertionError(f"decoded a time out of range: {exc}") from None


def _times(value: Any) -> Iterator[datetime]:
    if isinstance(value, BaseModel):
        for name in type(value).model_fields:
            yield from _times(getattr(value, name))
    elif isinstance(value, dict):
        for item in value.values():
            yield from _times(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _times(item)
    elif isinstance(value, datetime):
        yield value


def _check_redaction(body: bytes) -> None:
    redacted, changed = redact_body(body)
    assert isinstance(redacted, bytes), type(redacted)
    assert isinstance(changed, bool), type(changed)


def _check_log_line(
    type_name: str | None, body: bytes, outcome: Contract | ContractViolation
) -> None:
    # The consumer's "message dead-lettered" warning, with what a refusal would carry.
    record = logging.makeLogRecord(
        {
            "msg": "message dead-lettered",
            "levelname": "WARNING",
            "reason": getattr(outcome, "reason", None),
            "error": str(outcome),
            "message_type": type_name,
            "body": body.decode("utf-8", "replace"),
        }
    )
    line = _FORMATTER.format(record)
    assert "\n" not in line and line.isascii(), "the log line is not one ASCII line"
    assert json.loads(line)["event"] == "message dead-lettered"
