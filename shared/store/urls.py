"""URL helpers: never print a password.

A URL may name several hosts (libpq's `postgresql://user:pw@h1:5432,h2:5432/db`), carry its
password in the query (`?password=…`, as libpq and asyncpg accept), or be one of a
comma-separated list of URLs (nodes of one cluster): every password in any of these is masked.
"""

from __future__ import annotations

import re

MASK = "***"

SECRET_PARAMETERS = frozenset({"password", "sslpassword"})
"""Query parameters of a connection URL whose value is a secret."""

_NEXT_URL = re.compile(r",(?=[A-Za-z][A-Za-z0-9+.-]*://)")
"""Where a comma-separated list of URLs starts its next URL."""

_QUERY_PAIR = re.compile(r"(?P<sep>[?&;])(?P<name>[^=&;#]*)=(?P<value>[^&;#]*)")


def redact(url: str) -> str:
    """`url` with every password masked: the userinfo's and the query's, in each URL of a list."""
    return ",".join(_redact_one(part) for part in _NEXT_URL.split(url))


def _redact_one(url: str) -> str:
    scheme, found, rest = url.partition("://")
    if not found:
        return url
    end = min((i for i in (rest.find(c) for c in "/?#") if i >= 0), default=len(rest))
    netloc, tail = rest[:end], rest[end:]
    userinfo, at, hosts = netloc.rpartition("@")
    user, colon, password = userinfo.partition(":")
    if at and colon and password:
        netloc = f"{user}:{MASK}@{hosts}"
    return f"{scheme}://{netloc}{_QUERY_PAIR.sub(_masked_pair, tail)}"


def _masked_pair(pair: re.Match[str]) -> str:
    if pair["name"].lower() not in SECRET_PARAMETERS or not pair["value"]:
        return pair[0]
    return f"{pair['sep']}{pair['name']}={MASK}"
