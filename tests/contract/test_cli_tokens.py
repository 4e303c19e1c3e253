"""`orderflow tokens create|revoke|list` through the real command group, on PostgreSQL, each test
in a fresh hub: a secret shown once and kept only as its digest, one active token per name,
refusals as one line and a non-zero exit."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Iterator
from typing import TypeVar

import pytest
from click.testing import CliRunner, Result

from services.cli.main import main
from shared.domain.tokens import ApiToken, Role, digest_of
from shared.store.postgres import PostgresStore
from tests.conftest import POSTGRES_URL, service_missing

pytestmark = pytest.mark.postgres

Cli = Callable[..., Result]
T = TypeVar("T")


async def _store(hub: str) -> PostgresStore:
    try:
        return await PostgresStore.connect(
            POSTGRES_URL, hub, pool_size=2, timeout=5.0, command_timeout=10.0
        )
    except Exception as exc:
        service_missing("PostgreSQL", exc)
        raise


def _in_hub(hub: str, work: Callable[[PostgresStore], Awaitable[T]]) -> T:
    """`work` done in the hub's store, opened for it and closed after."""

    async def run() -> T:
        store = await _store(hub)
        try:
            return await work(store)
        finally:
            await store.close()

    return asyncio.run(run())


@pytest.fixture
def cli(hub: str) -> Iterator[Cli]:
    """`orderflow --hub <fresh hub> --store-url <PostgreSQL> …`, on a hub made for the test."""
    _in_hub(hub, lambda store: store.init())

    def invoke(*args: str) -> Result:
        return CliRunner().invoke(main, ["--hub", hub, "--store-url", POSTGRES_URL, *args])

    yield invoke
    _in_hub(hub, lambda store: store.drop())


def _find(hub: str, secret: str) -> ApiToken | None:
    return _in_hub(hub, lambda store: store.token_find(digest_of(secret)))


def _one_line_error(result: Result) -> str:
    assert result.exit_code == 1, result.output
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("orderflow: error: "), result.stderr
    return lines[0]


def test_create_prints_the_secret_once_and_the_store_keeps_its_digest(hub: str, cli: Cli) -> None:
    made = cli("tokens", "create", "--role", "shop", "--name", "acme", "--json")
    assert made.exit_code == 0, made.output
    answer = json.loads(made.stdout)
    assert set(answer) == {"name", "role", "token"}
    assert (answer["name"], answer["role"]) == ("acme", "shop")
    secret = answer["token"]
    assert secret.startswith("oft_")

    found = _find(hub, secret)
    assert found is not None and (found.name, found.role) == ("acme", Role.SHOP)
    assert found.digest == digest_of(secret) != secret

    shown = cli("tokens", "create", "--role", "viewer", "--name", "vera")
    assert shown.exit_code == 0, shown.output
    [line] = shown.stdout.splitlines()  # the secret alone, for a pipe
    assert line.startswith("oft_") and _find(hub, line) is not None
    assert "cannot be shown again" in shown.stderr and "vera" in shown.stderr

    listed = cli("tokens", "list", "--json")
    assert listed.exit_code == 0, listed.output
    assert secret not in listed.stdout and line not in listed.stdout
    assert found.digest not in listed.stdout and "digest" not in listed.stdout


def test_a_taken_or_invalid_name_is_refused_in_one_line(hub: str, cli: Cli) -> None:
    assert cli("tokens", "create", "--role", "operator", "--name", "otto").exit_code == 0
    taken = cli("tokens", "create", "--role", "viewer", "--name", "otto", "--json")
    assert "an active token is named 'otto' already" in _one_line_error(taken)

    invalid = cli("tokens", "create", "--role", "viewer", "--name", "otto the op")
    assert "1 to 64 letters, digits" in _one_line_error(invalid)
    assert cli("tokens", "create", "--role", "viewer", "--name", "").exit_code == 1

    listed = json.loads(cli("tokens", "list", "--json").stdout)["tokens"]
    assert [(t["name"], t["role"]) for t in listed] == [("otto", "operator")]

    bad_role = cli("tokens", "create", "--role", "admin", "--name", "x")
    assert bad_role.exit_code == 2 and "'admin' is not one of" in bad_role.stderr


def test_an_invalid_name_is_refused_before_any_server_is_asked() -> None:
    nowhere = "postgresql://postgres@127.0.0.1:9/nowhere"  # port 9: nothing listens
    result = CliRunner().invoke(
        main, ["--store-url", nowhere, "tokens", "create", "--role", "shop", "--name", "a/b"]
    )
    assert "1 to 64 letters" in _one_line_error(result)


def test_revoke_refuses_the_token_and_frees_its_name(hub: str, cli: Cli) -> None:
    old = json.loads(cli("tokens", "create", "--role", "viewer", "--name", "vera", "--json").stdout)
    revoked = cli("tokens", "revoke", "vera")
    assert revoked.exit_code == 0, revoked.output
    assert "revoked token 'vera'" in revoked.stdout
    assert _find(hub, old["token"]) is None

    again = cli("tokens", "revoke", "vera")
    assert "no active token is named 'vera'" in _one_line_error(again)
    assert "no active token is named 'nobody'" in _one_line_error(cli("tokens", "revoke", "nobody"))

    new = json.loads(cli("tokens", "create", "--role", "viewer", "--name", "vera", "--json").stdout)
    assert _find(hub, new["token"]) is not None and _find(hub, old["token"]) is None

    listed = json.loads(cli("tokens", "list", "--json").stdout)["tokens"]
    assert [(t["name"], t["revoked_at"] is None) for t in listed] == [
        ("vera", True),
        ("vera", False),
    ]


def test_list_shows_name_role_created_and_revoked_newest_first(hub: str, cli: Cli) -> None:
    empty = cli("tokens", "list")
    assert empty.exit_code == 0 and "0 token(s)" in empty.stdout
    for role, name in (("shop", "acme"), ("viewer", "vera"), ("operator", "otto")):
        assert cli("tokens", "create", "--role", role, "--name", name).exit_code == 0
    assert cli("tokens", "revoke", "vera").exit_code == 0

    listed = json.loads(cli("tokens", "list", "--json").stdout)["tokens"]
    assert {t["name"] for t in listed} == {"acme", "vera", "otto"}
    assert all(set(t) == {"name", "role", "created_at", "revoked_at"} for t in listed)
    created = [t["created_at"] for t in listed]
    assert created == sorted(created, reverse=True)
    [vera] = [t for t in listed if t["name"] == "vera"]
    assert vera["role"] == "viewer" and vera["revoked_at"] is not None

    table = cli("tokens", "list")
    assert table.exit_code == 0, table.output
    assert "3 token(s), 2 active, newest first" in table.stdout
    for header in ("name", "role", "created", "revoked"):
        assert header in table.stdout
    rows = {line.split()[1]: line for line in table.stdout.splitlines() if "UTC" in line}
    assert set(rows) == {"acme", "vera", "otto"}
    assert rows["vera"].count("UTC") == 2 and rows["acme"].count("UTC") == 1
    assert "oft_" not in table.stdout


def test_init_gives_an_existing_hub_the_tokens_table(hub: str, cli: Cli) -> None:
    """A hub made by an older release has no `api_tokens`: `orderflow init` (the store's
    `init`, idempotent) adds it and leaves the rest as it was."""

    async def older_hub(store: PostgresStore) -> None:
        await store._pool.execute(f'DROP TABLE "{hub}".api_tokens')

    _in_hub(hub, older_hub)
    missing = cli("tokens", "list")
    assert missing.exit_code == 1 and "api_tokens" in missing.stderr
    _in_hub(hub, lambda store: store.init())
    assert cli("tokens", "create", "--role", "shop", "--name", "acme").exit_code == 0
