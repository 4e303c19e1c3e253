"""The postgres profile's init script (`infra/postgres/init-app-user.sh`) leaves the application's
role able to connect to its own database only: not to `postgres`, not to `template1`.

It revokes CONNECT from PUBLIC on those two databases, which changes the server for every role:
so it runs against a private PostgreSQL server this test starts (initdb and pg_ctl on a free port
and a temporary data directory, stopped and removed afterwards), never the shared test server.
"""

from __future__ import annotations

import glob
import os
import secrets
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import asyncpg
import pytest

from shared.domain.coordination import ComponentStatus
from shared.domain.timing import utcnow
from shared.domain.tokens import Role, issue
from shared.store.postgres import PostgresStore
from shared.store.values import InsertOutcome
from tests.conftest import service_missing
from tests.support.factories import order_pair
from tests.support.topology import free_port

pytestmark = [pytest.mark.postgres]

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "infra" / "postgres" / "init-app-user.sh"
SUPERUSER = "postgres"


def _binary(name: str) -> str | None:
    found = shutil.which(name)
    if found is not None:
        return found
    candidates = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    return candidates[-1] if candidates else None


@dataclass
class Server:
    port: int
    data: Path

    def url(self, user: str, database: str) -> str:
        return f"postgresql://{user}@127.0.0.1:{self.port}/{database}"


def _as_server_user(command: list[str]) -> list[str]:
    """initdb and postgres refuse to run as root: as root, run them as the `postgres` user."""
    if os.geteuid() != 0:
        return command
    runuser = shutil.which("runuser")
    if runuser is None:
        service_missing("a private PostgreSQL server", "running as root without runuser")
    return [str(runuser), "-u", SUPERUSER, "--", *command]


@pytest.fixture
def server() -> Iterator[Server]:
    initdb, pg_ctl = _binary("initdb"), _binary("pg_ctl")
    if initdb is None or pg_ctl is None or shutil.which("psql") is None:
        service_missing("a private PostgreSQL server", "initdb, pg_ctl or psql is not installed")
    base = Path(tempfile.mkdtemp(prefix="orderflow-pg-"))
    data, log = base / "data", base / "server.log"
    if os.geteuid() == 0:
        shutil.chown(base, user=SUPERUSER)
    port = free_port()
    started = False
    try:
        done = subprocess.run(
            _as_server_user(
                [str(initdb), "-D", str(data), "-U", SUPERUSER, "--auth=trust", "--no-sync"]
            ),
            capture_output=True,
            text=True,
            timeout=120,
        )
        if done.returncode != 0:
            service_missing("a private PostgreSQL server", done.stderr[-500:])
        options = f"-p {port} -k {base} -c listen_addresses=127.0.0.1 -c fsync=off"
        start = [str(pg_ctl), "-D", str(data), "-l", str(log), "-o", options, "-w", "start"]
        done = subprocess.run(_as_server_user(start), capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr + (log.read_text() if log.exists() else "")
        started = True
        yield Server(port, data)
    finally:
        if started:
            stop = [str(pg_ctl), "-D", str(data), "-m", "immediate", "-w", "stop"]
            subprocess.run(_as_server_user(stop), capture_output=True, timeout=60)
        shutil.rmtree(base, ignore_errors=True)


def _run_script(
    server: Server, role: str, database: str, *, api_password: str | None = None, **env: str
) -> None:
    password = secrets.token_hex(16)
    password_file = Path(tempfile.mkdtemp(prefix="orderflow-pg-secret-")) / "password"
    if api_password is not None:
        (password_file.parent / "api").write_text(api_password + "\n")
        env = env | {"POSTGRES_API_PASSWORD_FILE": str(password_file.parent / "api")}
    try:
        password_file.write_text(password + "\n")
        done = subprocess.run(
            ["sh", str(SCRIPT)],
            env={
                "PATH": os.environ["PATH"],
                "PGHOST": "127.0.0.1",
                "PGPORT": str(server.port),
                "POSTGRES_USER": SUPERUSER,
                "POSTGRES_APP_USER": role,
                "POSTGRES_APP_DB": database,
                "POSTGRES_APP_PASSWORD_FILE": str(password_file),
                **env,
            },
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        shutil.rmtree(password_file.parent, ignore_errors=True)
    assert done.returncode == 0, done.stderr
    assert password not in done.stdout + done.stderr
    assert api_password is None or api_password not in done.stdout + done.stderr


async def _can_connect(url: str) -> bool:
    try:
        connection = await asyncpg.connect(url, timeout=10)
    except asyncpg.InsufficientPrivilegeError:
        return False
    await connection.close()
    return True


async def test_the_app_role_connects_to_its_own_database_and_no_other(server: Server) -> None:
    role, database = "orderflow_app", "orderflow_db"
    superuser = await asyncpg.connect(server.url(SUPERUSER, "postgres"))
    try:
        await superuser.execute("CREATE ROLE bystander LOGIN")
        # Before: PostgreSQL's default lets every role into postgres and template1.
        assert await _can_connect(server.url("bystander", "template1"))
        _run_script(server, role, database)
        assert await _can_connect(server.url(role, database))
        assert not await _can_connect(server.url(role, "postgres"))
        assert not await _can_connect(server.url(role, "template1"))
        # What the revocation costs: every other non-superuser role too (grant it where needed),
        # while superusers keep connecting anywhere.
        assert not await _can_connect(server.url("bystander", "postgres"))
        assert await _can_connect(server.url(SUPERUSER, "template1"))
        owned = await superuser.fetchval(
            "SELECT pg_get_userbyid(datdba) FROM pg_database WHERE datname = $1", database
        )
        assert owned == role
        # Nobody but the role (and superusers) may connect to the application's database.
        assert not await _can_connect(server.url("bystander", database))
    finally:
        await superuser.close()


async def test_the_revocation_can_be_skipped_on_a_shared_server(server: Server) -> None:
    _run_script(server, "kept_app", "kept_db", POSTGRES_KEEP_PUBLIC_CONNECT="1")
    assert await _can_connect(server.url("kept_app", "postgres"))
    assert await _can_connect(server.url("kept_app", "template1"))
    assert await _can_connect(server.url("kept_app", "kept_db"))


def test_the_script_refuses_two_passwords(server: Server, tmp_path: Path) -> None:
    (tmp_path / "password").write_text("one")
    done = subprocess.run(
        ["sh", str(SCRIPT)],
        env={
            "PATH": os.environ["PATH"],
            "PGHOST": "127.0.0.1",
            "PGPORT": str(server.port),
            "POSTGRES_APP_PASSWORD": "two",
            "POSTGRES_APP_PASSWORD_FILE": str(tmp_path / "password"),
        },
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1 and "both POSTGRES_APP_PASSWORD" in done.stderr


async def test_the_api_role_changes_rows_of_the_hub_s_tables_and_no_structure(
    server: Server,
) -> None:
    """The HTTP API's own credentials: rows of every table `orderflow init` made later, read and
    written as the API does; no table or schema created, altered, truncated or dropped."""
    role, database, api_password = "orderflow", "orderflow", secrets.token_hex(16)
    _run_script(server, role, database, api_password=api_password)
    superuser = await asyncpg.connect(server.url(SUPERUSER, database))
    try:
        # The test connects over TCP with trust auth; the role's password is what compose uses.
        owner = await PostgresStore.connect(
            server.url(role, database), "hub1", pool_size=2, timeout=10, command_timeout=10
        )
        await owner.init()  # as the application's role: the hub's schema and tables
        await owner.close()
        api_url = server.url("orderflow_api", database)
        api = await PostgresStore.connect(
            api_url, "hub1", pool_size=2, timeout=10, command_timeout=10
        )
        try:
            order, state = order_pair("o-1")
            assert await api.insert_order(order, state) is InsertOutcome.CREATED
            token, _ = issue("acme", Role.SHOP, now=utcnow())
            assert await api.token_create(token)
            assert await api.token_find(token.digest) == token
            assert await api.token_revoke("acme", at=utcnow())
            await api.report_status(
                ComponentStatus(name="api-1", kind="api", at=utcnow(), expires_at=utcnow())
            )
            await api.forget_status("api-1")
            assert (await api.get_state("o-1")) is not None
        finally:
            await api.close()
        raw = await asyncpg.connect(api_url)
        try:
            for ddl in (
                'CREATE TABLE "hub1".x (id int)',
                'ALTER TABLE "hub1".state ADD COLUMN x int',
                'DROP TABLE "hub1".alerts',
                'TRUNCATE "hub1".history',
                'CREATE SCHEMA "hub2"',
            ):
                with pytest.raises(asyncpg.InsufficientPrivilegeError):
                    await raw.execute(ddl)
        finally:
            await raw.close()
        tables = await superuser.fetchval(
            "SELECT count(*) FROM pg_tables WHERE schemaname = 'hub1'"
        )
        assert tables > 5
    finally:
        await superuser.close()
