"""Publishing what any AMQP client can publish but pamqp will not: bytes where AMQP has strings,
header names that are not UTF-8, timestamps past the year 9999."""

from __future__ import annotations

import contextlib
import struct
from collections.abc import Iterator
from typing import Any

import pamqp.encode

HUGE_TIMESTAMP = object()
"""Stands for a timestamp of 2**64 - 1 (milliseconds past the year 9999) on the wire."""


class Raw(bytes):
    """Bytes this test sends where AMQP has strings (only these: the consumer under test runs
    in this process and must meet the library as it is)."""


@contextlib.contextmanager
def raw_bytes_on_the_wire() -> Iterator[None]:
    """Let this process publish `Raw` bytes where AMQP has strings, as any other client can:
    pamqp refuses to encode bytes, but decodes such values as `bytes` when they are not UTF-8."""
    short, value = pamqp.encode.short_string, pamqp.encode.encode_table_value
    table, stamp = pamqp.encode.field_table, pamqp.encode.METHODS["timestamp"]

    def short_string(v: Any) -> bytes:
        return struct.pack("B", len(v)) + v if isinstance(v, Raw) else short(v)

    def table_value(v: Any) -> bytes:
        return b"S" + struct.pack(">I", len(v)) + v if isinstance(v, Raw) else value(v)

    def field_table(v: Any) -> bytes:
        if not any(isinstance(k, Raw) for k in v):
            return table(v)
        data = b"".join(struct.pack("B", len(k)) + bytes(k) + table_value(x) for k, x in v.items())
        return struct.pack(">I", len(data)) + data

    def timestamp(v: Any) -> bytes:
        return struct.pack(">Q", 2**64 - 1) if v is HUGE_TIMESTAMP else stamp(v)

    pamqp.encode.METHODS |= {"shortstr": short_string, "table": field_table, "timestamp": timestamp}
    pamqp.encode.encode_table_value = table_value  # type: ignore[assignment]
    try:
        yield
    finally:
        pamqp.encode.METHODS |= {"shortstr": short, "table": table, "timestamp": stamp}
        pamqp.encode.encode_table_value = value
