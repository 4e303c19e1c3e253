"""URL helpers: never print a password (nor a user name)."""

from __future__ import annotations

from shared.masking import mask_credentials


def redact(url: str) -> str:
    """The URL with its credentials masked: `shared.config.mask_credentials`, the one rule."""
    return mask_credentials(url)
