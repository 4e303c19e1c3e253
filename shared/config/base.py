"""The base every settings section shares: the environment's `ORDERFLOW_*` names, read once.

Each section is a `BaseSettings` of its own with the prefix `ORDERFLOW_` and the field names of
old, so that every variable keeps its name; `shared.config.settings` composes them.
"""

from __future__ import annotations

import os
from urllib.parse import urlsplit

from pydantic_settings import BaseSettings, SettingsConfigDict

STORE_SCHEMES = {
    "mongodb": "mongodb",
    "mongodb+srv": "mongodb",
    "postgresql": "postgresql",
    "postgres": "postgresql",
}


class Section(BaseSettings):
    """A group of settings one component reads.
    Field docs are the documentation: docs/reference/configuration.md is generated from them."""

    model_config = SettingsConfigDict(
        env_prefix="ORDERFLOW_",
        extra="ignore",
        frozen=True,
        use_attribute_docstrings=True,
        # `ORDERFLOW_X=` (as an uncommented .env.example line passes it) means the default.
        env_ignore_empty=True,
        # Compose secrets: the file `orderflow_rabbitmq_url` in this directory is
        # ORDERFLOW_RABBITMQ_URL (an environment variable still wins). Read only where
        # ORDERFLOW_SECRETS_DIR names one (the compose deployment: /run/secrets), so that nothing
        # warns of a missing directory elsewhere.
        secrets_dir=os.environ.get("ORDERFLOW_SECRETS_DIR") or None,
    )


def check_port(url: str) -> None:
    for host in urlsplit(url).netloc.rpartition("@")[2].split(","):
        _, colon, port = host.rpartition(":")
        if colon and not port.isdigit():
            raise ValueError(f"port {port!r} is not a number")
