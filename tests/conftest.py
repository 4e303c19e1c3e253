"""Shared fixtures: real services, a fresh task hub per test, and loud failures in CI.

A missing RabbitMQ or PostgreSQL skips its tests on a laptop, but fails them when
`ORDERFLOW_REQUIRE_SERVICES=1` (CI sets it), so a missing service never hides as a skip.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import uuid
from pathlib import Path
from urllib.parse import urlsplit

import pytest

# A developer's `.env` (README "Run it") and the credentials `orderflow up` keeps beside it are
# for their shell, not for the tests: the tests, and every process they start, read an empty
# `.env` in a directory of the run's own instead, where an `up` of theirs keeps its credentials
# (shared/config/settings.py `env_files`).
_SETTINGS_DIR = Path(tempfile.mkdtemp(prefix="orderflow-tests-"))
atexit.register(shutil.rmtree, _SETTINGS_DIR, ignore_errors=True)
(_SETTINGS_DIR / ".env").touch()
os.environ["ORDERFLOW_ENV_FILE"] = str(_SETTINGS_DIR / ".env")

REQUIRE_SERVICES = os.environ.get("ORDERFLOW_REQUIRE_SERVICES") == "1"
POSTGRES_URL = os.environ.get(
    "ORDERFLOW_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test"
)
RABBITMQ_URL = os.environ.get("ORDERFLOW_TEST_RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672/")
RABBITMQ_USER = urlsplit(RABBITMQ_URL).username or "guest"
"""The test broker's user: every process of a test runs as it, and messages a test publishes
below our publisher carry it as their `user_id` (shared/broker/senders.py)."""
MONGODB_URL = os.environ.get("ORDERFLOW_TEST_MONGODB_URL")


def service_missing(what: str, why: object) -> None:
    """Skip on a laptop; fail in CI."""
    message = f"{what} is not reachable: {why}"
    if REQUIRE_SERVICES:
        pytest.fail(f"{message} (ORDERFLOW_REQUIRE_SERVICES=1)", pytrace=False)
    pytest.skip(message)


@pytest.fixture
def hub() -> str:
    """A task hub of this test's own: queues, exchanges and schemas no other test sees."""
    return f"t{uuid.uuid4().hex[:12]}"
