"""Receiving any message a client can publish, without losing the connection over it.

pamqp, under aiormq and aio-pika, decodes a message's properties as it reads the frame, and a
value it cannot decode — a short string (a message id, a type, a content type) or a header name
that is not UTF-8, a timestamp beyond the year 9999 — raises inside the connection's reader.
aiormq then closes the whole connection; the robust connection reconnects; the broker
redelivers the same message, first in line; and the connection closes again. One such message
from any application stops every consumer of the queue, and each reconnect counts a delivery
against every message in flight. RabbitMQ passes these values through unchecked.

`tolerate_undecodable_properties` makes pamqp's decoding total: a short string that is not UTF-8
(a property, or a routing key in the broker's Basic.Deliver) is read as its bytes, as pamqp
already reads long strings (aio-pika then turns such a message id or type into the text of its
repr, which is harmless: usable as a message id, an unknown type); a property that still cannot
be decoded (a header table with a key that is not UTF-8, a timestamp past 9999) is skipped by
its encoded length and marked (`UNDECODABLE_HEADERS` in place of the table, no timestamp), and
the consumer dead-letters the message `invalid-properties` (shared/broker/envelope.py). It
replaces one method and one decoder of pamqp, once per process, from
`shared.broker.rabbitmq.connection.connect`.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

from pamqp import base, decode, encode

UNDECODABLE_HEADERS = "x-orderflow-undecodable-headers"
"""The only header of a message whose header table could not be decoded: its size in bytes,
as an `Undecodable`."""


class Undecodable(int):
    """The size of a header table that could not be decoded: a type no decoding yields, so a
    sender that sets a header of that name itself does not pass for it (issue 33)."""


_SKIP: dict[str, Callable[[bytes], int]] = {
    # The encoded length of each type Basic.Properties has.
    "shortstr": lambda data: 1 + data[0],
    "table": lambda data: 4 + struct.unpack_from(">I", data)[0],
    "octet": lambda data: 1,
    "timestamp": lambda data: 8,
}


def _undecodable(data_type: str, raw: bytes) -> Any:
    if data_type == "table":
        return {UNDECODABLE_HEADERS: Undecodable(len(raw))}
    return None  # a timestamp, an octet: as if absent


def _tolerant_unmarshal(self: base.BasicProperties, flags: int, data: bytes) -> None:
    """pamqp's `BasicProperties.unmarshal`, total: a property it cannot decode is skipped."""
    for name in self.__slots__:
        if flags & self.flags[name]:
            data_type = getattr(self.__class__, "_" + name)
            try:
                consumed, value = decode.by_type(data, data_type)
            except Exception:
                skip = _SKIP.get(data_type)
                if skip is None:
                    raise
                consumed = skip(data)
                value = _undecodable(data_type, data[:consumed])
            if name == "expiration" and not isinstance(value, str):
                value = None  # aio-pika refuses any expiration but text (the broker checks it)
            setattr(self, name, value)
            data = data[consumed:]


def _tolerant_short_str(value: bytes) -> tuple[int, str | bytes]:
    """pamqp's `short_str`, returning bytes instead of raising when they are not UTF-8 (as its
    `long_str` already does): the broker's own replies may quote a client's bytes."""
    try:
        return _strict_short_str(value)
    except UnicodeDecodeError:
        length = value[0]
        return length + 1, bytes(value[1 : length + 1])


_strict_short_str = decode.short_str
_strict_unmarshal = base.BasicProperties.unmarshal


def tolerate_undecodable_properties() -> None:
    """Make pamqp's decoding of message properties total (idempotent)."""
    base.BasicProperties.unmarshal = _tolerant_unmarshal  # type: ignore[method-assign]
    decode.METHODS["shortstr"] = _tolerant_short_str


def header_size(name: str, value: Any) -> int | None:
    """The encoded size of one header, or None when an AMQP client cannot send it."""
    try:
        return len(encode.field_table({name: value}))
    except Exception:  # pamqp raises TypeError, ValueError or struct.error
        return None
