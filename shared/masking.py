"""Credentials never shown: the one function every URL (or text that may quote one) passes
through before a person sees it. Standard library only, so that the quickest command
(`orderflow health`, a container's healthcheck) may use it without loading the settings."""

from __future__ import annotations

import re

MASK = "***"
_USERINFO = re.compile(
    r"(?<![A-Za-z0-9+.-])(?P<scheme>[A-Za-z][A-Za-z0-9+.-]{0,30}://)(?P<userinfo>[^/?#\s]*)@"
)
"""A URL's `user:password@`, up to the last `@` of its authority (a raw `@` in a password)."""
_PARAMETER = re.compile(
    r"(?<![\w.-])(?P<key>[\w.-]+\s*=\s*)"
    r"(?P<value>(?:(?!,[A-Za-z][A-Za-z0-9+.-]{0,30}://)[^&#\s])*)"
)
"""A `key=value` (a query string's, or a libpq DSN's): the value runs to `&`, `#`, a space,
or the comma before the next URL of a list. Each key is read once (linear in the text)."""
_SECRET_KEY = re.compile(
    r"password|passwd|pwd|secret|token|user|authmechanismproperties|apikey|api_key|sslkey",
    re.IGNORECASE,
)


def mask_credentials(text: str) -> str:
    """`text` with every credential a URL can carry masked: the user and the password of each
    URL (a comma-separated list of URLs, a multi-host URL), and the value of each secret
    parameter (`?password=`, `user=`, `sslpassword=`, `authMechanismProperties=`, a libpq
    `password=`). Every URL the CLI prints, and every error line it writes, passes through
    here. Idempotent; a URL without credentials comes back unchanged."""
    masked = _USERINFO.sub(_mask_userinfo, text)
    return _PARAMETER.sub(_mask_parameter, masked)


def _mask_parameter(match: re.Match[str]) -> str:
    if match["value"] and _SECRET_KEY.search(match["key"]):
        return match["key"] + MASK
    return match[0]


def _mask_userinfo(match: re.Match[str]) -> str:
    hidden = f"{MASK}:{MASK}" if ":" in match["userinfo"] else MASK
    return f"{match['scheme']}{hidden}@"
