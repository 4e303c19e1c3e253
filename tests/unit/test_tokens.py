"""API tokens as the domain makes them (shared/domain/tokens.py): secrets, digests, names."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest
from pydantic import ValidationError

from shared.domain.models import STORED
from shared.domain.tokens import ApiToken, Role, digest_of, issue, new_secret, valid_name

NOW = datetime(2025, 1, 2, 3, 4, 5, 6000, tzinfo=UTC)


def test_a_secret_is_fresh_prefixed_and_url_safe() -> None:
    secrets = {new_secret() for _ in range(100)}
    assert len(secrets) == 100
    for secret in secrets:
        assert secret.startswith("oft_")
        assert len(secret) == 4 + 43  # 32 bytes in unpadded URL-safe base64
        assert set(secret[4:]) <= set(
            "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
        )


def test_the_digest_is_the_hex_sha256_of_the_secret() -> None:
    assert digest_of("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    assert digest_of("oft_a") != digest_of("oft_b")


def test_issue_keeps_only_the_digest_of_the_secret_it_returns() -> None:
    token, secret = issue("acme", Role.SHOP, now=NOW)
    assert (token.name, token.role, token.created_at, token.revoked_at) == (
        "acme",
        Role.SHOP,
        NOW,
        None,
    )
    assert token.digest == digest_of(secret) and secret not in token.model_dump_json()
    assert token.active and token.schema_version == 1


@pytest.mark.parametrize("name", ["a", "acme", "shop-1.eu_west", "A" * 64, "0"])
def test_valid_names(name: str) -> None:
    assert valid_name(name) == name
    assert issue(name, Role.VIEWER, now=NOW)[0].name == name


@pytest.mark.parametrize(
    "name", ["", "a" * 65, "with space", "a/b", "naïve", "x\n", "a:b", "emoji🙂", "tab\t"]
)
def test_invalid_names_are_refused_saying_what_a_name_may_be(name: str) -> None:
    with pytest.raises(ValueError, match=r"1 to 64 letters, digits, '\.', '_' or '-'"):
        valid_name(name)
    with pytest.raises(ValueError, match="1 to 64 letters"):
        issue(name, Role.VIEWER, now=NOW)


@pytest.mark.parametrize("name", ["a.b", "Acme", "a" * 24, "-x", "_x"])
def test_a_shop_s_name_prefixes_its_order_ids_so_it_is_shorter_and_has_no_dot(name: str) -> None:
    with pytest.raises(ValueError, match="prefixes the shop's order ids"):
        issue(name, Role.SHOP, now=NOW)
    assert issue(name, Role.OPERATOR, now=NOW)[0].name == name


@pytest.mark.parametrize("name", ["acme", "a", "shop_2-eu", "a" * 23])
def test_shop_names(name: str) -> None:
    assert issue(name, Role.SHOP, now=NOW)[0].role is Role.SHOP


def test_a_stored_name_is_read_as_it_is() -> None:
    token, _ = issue("acme", Role.SHOP, now=NOW)
    stored = token.model_dump() | {"name": "made under older rules"}
    assert ApiToken.model_validate(stored, context=STORED).name == "made under older rules"


def test_times_must_be_aware_and_are_kept_in_utc() -> None:
    token, _ = issue("acme", Role.SHOP, now=NOW)
    fields = token.model_dump()
    with pytest.raises(ValidationError, match="timezone"):
        ApiToken.model_validate(fields | {"created_at": NOW.replace(tzinfo=None)})
    east = NOW.astimezone(timezone(timedelta(hours=2)))
    moved = ApiToken.model_validate(fields | {"created_at": east, "revoked_at": east})
    assert moved.created_at == NOW and moved.created_at.utcoffset() == timedelta(0)
    assert moved.revoked_at is not None and moved.revoked_at.utcoffset() == timedelta(0)


@pytest.mark.parametrize("digest", ["", "abc", "A" * 64, "g" * 64, "a" * 63, "a" * 65])
def test_a_digest_is_64_lowercase_hex_digits(digest: str) -> None:
    token, _ = issue("acme", Role.SHOP, now=NOW)
    with pytest.raises(ValidationError):
        ApiToken.model_validate(token.model_dump() | {"digest": digest})


def test_roles_are_the_three_the_api_knows() -> None:
    assert [r.value for r in Role] == ["shop", "viewer", "operator"]
    token, _ = issue("acme", Role.SHOP, now=NOW)
    with pytest.raises(ValidationError):
        ApiToken.model_validate(token.model_dump() | {"role": "admin"})
