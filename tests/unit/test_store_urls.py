"""Store and broker URLs as printed: every user and password masked, whatever form the URL
takes (shared/masking.py is the one rule)."""

from __future__ import annotations

import pytest

from shared.store.urls import redact


@pytest.mark.parametrize(
    ("url", "printed"),
    [
        ("postgresql://u:pw@h:5432/db", "postgresql://***:***@h:5432/db"),
        (
            "postgresql://u:pw@h1:5432,h2:5433/db?target_session_attrs=read-write",
            "postgresql://***:***@h1:5432,h2:5433/db?target_session_attrs=read-write",
        ),
        (
            "postgresql://u@h1,h2/db?target_session_attrs=read-write&password=sec",
            "postgresql://***@h1,h2/db?target_session_attrs=read-write&password=***",
        ),
        ("postgresql://u:p@ss@h1,h2/db", "postgresql://***:***@h1,h2/db"),
        ("postgresql://u:p%40ss@h1/db?sslpassword=k", "postgresql://***:***@h1/db?sslpassword=***"),
        (
            "amqp://guest:one@a:5672/,amqp://guest:two@b:5673/",
            "amqp://***:***@a:5672/,amqp://***:***@b:5673/",
        ),
        (
            "mongodb://m1:27017,m2:27017/?replicaSet=rs",
            "mongodb://m1:27017,m2:27017/?replicaSet=rs",
        ),
        ("postgresql://u@h/db", "postgresql://***@h/db"),
        ("not a url", "not a url"),
    ],
)
def test_every_password_is_masked(url: str, printed: str) -> None:
    assert redact(url) == printed
