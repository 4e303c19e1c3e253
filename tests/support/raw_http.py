"""HTTP below the client libraries, as an attacker sends it: a body larger than any limit (with
its `Content-Length`, or chunked and never ending), a head never finished, a connection that
says nothing; and the resident memory of the process that answers."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from pathlib import Path

MIB = 1 << 20


def memory_kib(pid: int) -> dict[str, int]:
    """The process's resident memory now (`VmRSS`) and at its peak so far (`VmHWM`), in KiB."""
    found: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            found[name] = int(value.split()[0])
    return found


@dataclass
class Answer:
    status: int | None
    """None: the server closed without an answer."""
    text: str
    sent: int
    """Body bytes the server took before it answered or closed."""


def _status(head: bytes) -> int | None:
    parts = head.split(b" ", 2)
    return int(parts[1]) if len(parts) > 1 and parts[0].startswith(b"HTTP/") else None


async def upload(
    port: int,
    path: str,
    *,
    size: int | None,
    token: str | None = None,
    give_up_after: int = 200 * MIB,
    timeout: float = 30.0,
) -> Answer:
    """POST `size` bytes of a JSON string to `path` (`size` None: chunked, endless) a MiB at a
    time, until the server answers or closes, or `give_up_after` bytes were sent (then the body
    is ended, so that a server that reads it all answers at last)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    head = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1", "Content-Type: application/json"]
    if token is not None:
        head.append(f"Authorization: Bearer {token}")
    head.append("Transfer-Encoding: chunked" if size is None else f"Content-Length: {size}")
    writer.write(("\r\n".join(head) + "\r\n\r\n").encode())
    answered = asyncio.create_task(reader.read(64 * 1024))
    sent = 0
    total = give_up_after if size is None else min(size, give_up_after)
    piece = b"x" * MIB
    try:
        with contextlib.suppress(ConnectionError):
            while sent < total and not answered.done():
                part = piece[: total - sent]
                if sent == 0:  # one JSON string, the whole body: what a server must parse
                    part = b'"' + part[1:]
                if size is not None and sent + len(part) == size:
                    part = part[:-1] + b'"'
                writer.write(
                    f"{len(part):x}\r\n".encode() + part + b"\r\n" if size is None else part
                )
                await writer.drain()
                sent += len(part)
            if size is None and not answered.done():
                writer.write(b"0\r\n\r\n")
                await writer.drain()
        try:
            data = await asyncio.wait_for(answered, timeout)
        except ConnectionError:
            data = b""
        return Answer(_status(data), data.decode(errors="replace"), sent)
    finally:
        answered.cancel()
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()


async def closed_after(port: int, send: bytes, *, timeout: float) -> tuple[float | None, bytes]:
    """Open a connection, send `send` (nothing: a silent connection) and wait: the seconds until
    the server closed it (None: still open after `timeout`), and what it answered meanwhile."""
    loop = asyncio.get_running_loop()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    start = loop.time()
    got = b""
    try:
        if send:
            writer.write(send)
            await writer.drain()
        while True:
            left = start + timeout - loop.time()
            if left <= 0:
                return None, got
            try:
                data = await asyncio.wait_for(reader.read(64 * 1024), left)
            except TimeoutError:
                return None, got
            except ConnectionError:
                return loop.time() - start, got
            if not data:
                return loop.time() - start, got
            got += data
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()
