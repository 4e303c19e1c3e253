"""pamqp alone closes the connection over properties it cannot decode; the tolerant decoding
(shared/broker/wire.py) reads every such frame and says what it could not decode."""

from __future__ import annotations

from typing import Any

import pamqp.commands
import pamqp.frame
import pamqp.header
import pytest

from shared.broker import wire
from tests.support.wire_bytes import HUGE_TIMESTAMP, Raw, raw_bytes_on_the_wire

BAD = {
    "message-id": {"message_id": Raw(b"\xff\xfe")},
    "header-name": {"headers": {Raw(b"\xff"): 1}},
    "timestamp": {"timestamp": HUGE_TIMESTAMP},
    "content-type": {"content_type": Raw(b"\xc3\x28")},
}


def _frame(properties: dict[str, Any]) -> bytes:
    props = pamqp.commands.Basic.Properties(message_id="m", app_id="after")
    for name, value in properties.items():
        object.__setattr__(props, name, value)
    header = pamqp.header.ContentHeader(0, 3, props)
    with raw_bytes_on_the_wire():
        return pamqp.frame.marshal(header, 1)


@pytest.mark.parametrize("what", sorted(BAD))
def test_pamqp_alone_cannot_read_the_frame(what: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pamqp.base.BasicProperties, "unmarshal", wire._strict_unmarshal)
    monkeypatch.setitem(pamqp.decode.METHODS, "shortstr", wire._strict_short_str)
    with pytest.raises(pamqp.exceptions.UnmarshalingException):
        pamqp.frame.unmarshal(_frame(BAD[what]))


@pytest.mark.parametrize("what", sorted(BAD))
def test_the_tolerant_decoding_reads_it_and_the_properties_after_it(what: str) -> None:
    wire.tolerate_undecodable_properties()
    _, _, header = pamqp.frame.unmarshal(_frame(BAD[what]))
    props = header.properties
    assert props.app_id == "after"  # what follows the bad property is read as sent
    if what == "message-id":
        assert props.message_id == b"\xff\xfe"
    elif what == "header-name":
        assert set(props.headers) == {wire.UNDECODABLE_HEADERS}
    elif what == "timestamp":
        assert props.timestamp is None
    else:
        assert props.content_type == b"\xc3\x28"


# -- the intake states (shared/broker/delivery.intake_state)

from shared.broker.delivery import INTAKE_HEALTHY, intake_state  # noqa: E402


@pytest.mark.parametrize(
    ("facts", "state"),
    [
        ({"started": False}, "not-started"),
        ({"paused": True, "subscribed": False}, "paused"),
        ({"subscribed": False}, "not-subscribed"),
        ({"ready": 3, "idle_s": 61.0}, "stalled"),
        ({"ready": 3, "idle_s": 59.0}, "consuming"),
        ({"ready": 0, "idle_s": 3600.0}, "consuming"),  # idle with nothing to take is fine
        ({"ready": None, "idle_s": 3600.0}, "consuming"),  # unknown depth is not a stall
    ],
)
def test_intake_state(facts: dict[str, Any], state: str) -> None:
    given = {"started": True, "paused": False, "subscribed": True, "ready": 0, "idle_s": 0.0}
    assert intake_state(**(given | facts), stall_after_s=60.0) == state
    assert (state in INTAKE_HEALTHY) == (state in ("consuming", "paused"))


# -- the neighbours, searched: any bytes in any short-string property, any header table

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

SHORT_STRINGS = [
    "content_type",
    "content_encoding",
    "correlation_id",
    "reply_to",
    "message_id",
    "message_type",
    "user_id",
    "cluster_id",
]


@settings(max_examples=300)
@given(
    st.dictionaries(st.sampled_from(SHORT_STRINGS), st.binary(max_size=255).map(Raw), max_size=4),
    st.dictionaries(
        st.binary(min_size=1, max_size=20).map(Raw),
        st.one_of(st.binary(max_size=30).map(Raw), st.integers(-(2**31), 2**31 - 1)),
        max_size=3,
    ),
    st.one_of(st.none(), st.just(HUGE_TIMESTAMP)),
)
def test_any_bytes_in_any_property_are_read_and_the_properties_after_them_too(
    shorts: dict[str, Raw], headers: dict[Raw, Any], stamp: object
) -> None:
    wire.tolerate_undecodable_properties()
    properties: dict[str, Any] = dict(shorts)
    if headers:
        properties["headers"] = headers
    if stamp is not None:
        properties["timestamp"] = stamp
    _, _, header = pamqp.frame.unmarshal(_frame(properties))
    props = header.properties
    assert props.app_id == "after"  # encoded after every one of them
    for name, value in shorts.items():
        got = getattr(props, name)
        assert got == bytes(value) or got == bytes(value).decode("utf-8")
