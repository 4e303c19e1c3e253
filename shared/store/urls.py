"""URL helpers: never print a password."""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit


def redact(url: str) -> str:
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
    return urlunsplit(parts._replace(netloc=netloc))
