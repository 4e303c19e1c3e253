"""`mask_credentials`: no credential a URL can carry survives it, in any form the CLI prints."""

from __future__ import annotations

from urllib.parse import quote

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from shared.masking import MASK, mask_credentials
from shared.store.urls import redact

secrets = st.text(min_size=6, max_size=30).filter(lambda s: s.strip() == s)
"""Any text: as a URL carries it, percent-encoded (a raw `/`, `?`, `#` would end the URL's
authority: no URL parser reads such a password as one)."""

TEMPLATES = [
    "amqp://{user}:{password}@localhost:5672/vhost",
    "amqps://{user}:{password}@rabbit-1:5671,amqps://{user}:{password}@rabbit-2:5671/",
    "postgresql://{user}:{password}@pg-1:5432,pg-2:5432/db?target_session_attrs=read-write",
    "postgres://{user}@pg/db?sslmode=require&password={password}",
    "postgresql:///db?host=/run/pg&user={user}&password={password}&sslpassword={password}",
    "mongodb://{user}:{password}@m1:27017,m2:27017/?replicaSet=rs&authSource=admin",
    "mongodb+srv://{user}:{password}@cluster.example/?authMechanismProperties={password}",
    "store URL mongodb://{user}:{password}@db: connection refused",
    "host=pg user={user} password={password} dbname=test",
]


def skeleton(template: str) -> str:
    return template.replace("{user}", "").replace("{password}", "")


@pytest.mark.parametrize("template", TEMPLATES)
@given(user=secrets, password=secrets)
def test_no_generated_credential_survives(template: str, user: str, password: str) -> None:
    encoded_user, encoded_password = quote(user, safe=""), quote(password, safe="")
    # A secret that is part of the URL's own words could not be told from them.
    assume(encoded_user not in skeleton(template) and encoded_password not in skeleton(template))
    assume(encoded_user not in MASK and encoded_password not in MASK)
    url = template.format(user=encoded_user, password=encoded_password)
    masked = mask_credentials(url)
    assert encoded_password not in masked
    assert encoded_user not in masked
    assert mask_credentials(masked) == masked  # idempotent


@given(password=st.text(alphabet=st.characters(blacklist_characters="/?#"), min_size=6))
def test_a_raw_password_with_at_and_colon_is_masked_whole(password: str) -> None:
    assume(not any(c.isspace() for c in password))  # a URL ends at a space
    assume(password not in "amqp://***:***@host:5672/")
    masked = mask_credentials(f"amqp://orderflow:{password}@host:5672/")
    assert masked == "amqp://***:***@host:5672/"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("http://127.0.0.1:8080", "http://127.0.0.1:8080"),
        ("mongodb://localhost:27017", "mongodb://localhost:27017"),
        ("postgresql://alice@pg/db", "postgresql://***@pg/db"),
        ("amqp://guest:guest@h1,amqp://u:p@h2/v", "amqp://***:***@h1,amqp://***:***@h2/v"),
        ("postgresql://pg/db?sslmode=require&application_name=x", None),
        ("the order o-1 failed: HTTP 503 x=1", None),
    ],
)
def test_what_is_masked_and_what_is_kept(text: str, expected: str | None) -> None:
    assert mask_credentials(text) == (text if expected is None else expected)
    assert redact(text) == mask_credentials(text)
