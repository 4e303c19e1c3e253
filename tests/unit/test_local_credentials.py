"""`orderflow up`'s local credentials (services/cli/credentials.py): made once, kept private,
read by every command as `.env` is, the environment and `.env` winning over them."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from services.cli.credentials import (
    OPERATOR_TOKEN,
    SHOP_TOKEN,
    keep_logins,
    local_credentials,
)
from shared.config import env_files, load_settings
from shared.config.settings import CREDENTIALS_FILE
from shared.domain.timing import utcnow
from shared.domain.tokens import Role, digest_of, issue
from shared.remote.admin import TOKEN_VARIABLE, admin_token
from shared.store.memory import MemoryStore


@pytest.fixture
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A directory of the test's own as the current one, with a `.env` and nothing set."""
    monkeypatch.delenv("ORDERFLOW_ENV_FILE", raising=False)
    monkeypatch.delenv(TOKEN_VARIABLE, raising=False)
    monkeypatch.chdir(tmp_path)
    (tmp_path / ".env").write_text("ORDERFLOW_HUB=from_dot_env\n")
    return tmp_path


def test_the_first_run_makes_them_private_and_later_runs_reuse_them(here: Path) -> None:
    made = local_credentials(remote=True, api=True)
    assert set(made) == {TOKEN_VARIABLE, SHOP_TOKEN, OPERATOR_TOKEN}
    path = here / CREDENTIALS_FILE
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert "ORDERFLOW_STORE_URL" not in (here / ".env").read_text() + path.read_text()
    written = path.read_text()
    assert local_credentials(remote=True, api=True) == made
    assert path.read_text() == written  # nothing made again
    # Every command reads them as it reads .env: audit's token, first of all.
    assert admin_token() == made[TOKEN_VARIABLE]
    assert env_files() == (CREDENTIALS_FILE, ".env")


def test_only_what_the_run_needs_is_made_and_a_wider_mode_is_narrowed(here: Path) -> None:
    assert set(local_credentials(remote=False, api=True)) == {SHOP_TOKEN, OPERATOR_TOKEN}
    path = here / CREDENTIALS_FILE
    os.chmod(path, 0o644)
    added = local_credentials(remote=True, api=False)
    assert TOKEN_VARIABLE in added and SHOP_TOKEN in added  # kept, and the new one added
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_a_token_set_elsewhere_is_used_and_none_is_made(
    here: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (here / ".env").write_text(f"{TOKEN_VARIABLE}=from-dot-env\n")
    assert local_credentials(remote=True, api=False)[TOKEN_VARIABLE] == "from-dot-env"
    assert not (here / CREDENTIALS_FILE).exists()
    monkeypatch.setenv(TOKEN_VARIABLE, "from-the-environment")
    assert local_credentials(remote=True, api=False)[TOKEN_VARIABLE] == "from-the-environment"


def test_dot_env_and_the_environment_win_over_the_file(
    here: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (here / CREDENTIALS_FILE).write_text(
        f"ORDERFLOW_HUB=from_credentials\nORDERFLOW_PREFETCH=7\n{TOKEN_VARIABLE}=from-file\n"
    )
    settings = load_settings()
    assert (settings.hub, settings.broker.prefetch) == ("from_dot_env", 7)
    assert admin_token() == "from-file"
    monkeypatch.setenv("ORDERFLOW_HUB", "from_environment")
    assert load_settings().hub == "from_environment"


def test_the_file_sits_beside_the_env_file_named(
    here: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    elsewhere = here / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "staging.env").write_text("")
    monkeypatch.setenv("ORDERFLOW_ENV_FILE", str(elsewhere / "staging.env"))
    local_credentials(remote=True, api=False)
    assert (elsewhere / CREDENTIALS_FILE).exists() and not (here / CREDENTIALS_FILE).exists()


async def test_the_logins_become_tokens_of_each_store_once(here: Path) -> None:
    logins = local_credentials(remote=False, api=True)
    store = MemoryStore()
    assert await keep_logins(store, logins) == []
    assert await keep_logins(store, logins) == []  # found, not made again
    shop = await store.token_find(digest_of(logins[SHOP_TOKEN]))
    assert shop is not None and (shop.name, shop.role) == ("local-shop", Role.SHOP)
    # Another hub's store, where another token holds the console's name: refused, said.
    other = MemoryStore()
    taken, _ = issue("local-operator", Role.OPERATOR, now=utcnow())
    await other.token_create(taken)
    refused = await keep_logins(other, logins)
    assert [login.variable for login in refused] == [OPERATOR_TOKEN]


async def test_a_revoked_login_is_replaced_not_refused_for_ever(here: Path) -> None:
    """A review's finding: `tokens revoke local-operator` (it leaked) left every later `up`
    refusing the login and advising a revoke that could not succeed."""
    logins = local_credentials(remote=False, api=True)
    store = MemoryStore()
    assert await keep_logins(store, logins) == []
    burnt = logins[OPERATOR_TOKEN]
    assert await store.token_revoke("local-operator", at=utcnow())
    again = local_credentials(remote=False, api=True)
    assert await keep_logins(store, again) == []
    assert again[OPERATOR_TOKEN] != burnt
    assert local_credentials(remote=False, api=True)[OPERATOR_TOKEN] == again[OPERATOR_TOKEN]
    found = await store.token_find(digest_of(again[OPERATOR_TOKEN]))
    assert found is not None and found.name == "local-operator" and found.revoked_at is None
    assert await store.token_find(digest_of(burnt)) is None
