"""A private PostgreSQL cluster (and a replicated pair with a standby to promote), for a nemesis
to stop, crash and restart (servers.py says how they are used)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from pathlib import Path
from typing import Self

from harness.nemesis.process import (
    CLIENT_TIMEOUT_S,
    STOP_TIMEOUT_S,
    PrivateServer,
    RunAs,
    run,
)
from shared.errors import ServerMissing

SUPERUSER = "postgres"


def _version(name: str) -> tuple[int, ...]:
    return tuple(int(part) for part in name.split(".") if part.isdigit())


def postgres_bindir() -> Path:
    """The directory of `initdb`, `postgres` and their clients: `pg_ctl`'s on PATH (through its
    symlinks), else the newest /usr/lib/postgresql/*/bin (Debian's)."""
    candidates: list[Path] = []
    on_path = shutil.which("pg_ctl")
    if on_path is not None:
        candidates.append(Path(os.path.realpath(on_path)).parent)
    installed = Path("/usr/lib/postgresql").glob("*/bin")
    candidates += sorted(installed, key=lambda p: _version(p.parent.name), reverse=True)
    for bindir in candidates:
        if all((bindir / name).is_file() for name in ("initdb", "postgres", "pg_isready")):
            return bindir
    raise ServerMissing("PostgreSQL's initdb, postgres and pg_isready are not installed")


class PrivatePostgres(PrivateServer):
    """A PostgreSQL cluster of its own (initdb in a temporary directory), on a free port of
    127.0.0.1, trust authentication, with one database created: `url` names it."""

    kind = "PostgreSQL"
    stop_signal = signal.SIGINT  # "fast" shutdown: sessions ended, a checkpoint written
    foreign_environment = ("PG",)

    def __init__(self, *, database: str = "orderflow", startup_timeout: float = 60.0) -> None:
        super().__init__(startup_timeout=startup_timeout)
        self.database = database
        self.bindir = postgres_bindir()
        # initdb and postgres refuse to run as root.
        self.run_as = RunAs.named(SUPERUSER) if os.geteuid() == 0 else None

    @property
    def url(self) -> str:
        return f"postgresql://{SUPERUSER}@127.0.0.1:{self.port}/{self.database}"

    @property
    def data_dir(self) -> Path:
        return self.base / "data"

    def _prepare(self) -> None:
        if self.run_as is not None:
            os.chown(self.base, self.run_as.uid, self.run_as.gid)
        initdb = [str(self.bindir / "initdb"), "-D", str(self.data_dir), "-U", SUPERUSER]
        initdb += ["--auth=trust", "--no-sync", "--no-locale", "--encoding=UTF8"]
        run(initdb, env=self.environment(), cwd=self.base, run_as=self.run_as)

    def _argv(self) -> list[str]:
        settings = {
            "listen_addresses": "127.0.0.1",
            "unix_socket_directories": str(self.base),
            "max_connections": "200",
            # Durability against a crash of the server is what the tests need, not of the machine.
            "fsync": "off",
            # Dynamic shared memory in the data directory, not /dev/shm: nothing outlives a kill.
            "dynamic_shared_memory_type": "mmap",
        }
        argv = [str(self.bindir / "postgres"), "-D", str(self.data_dir), "-p", str(self.port)]
        for name, value in settings.items():
            argv += ["-c", f"{name}={value}"]
        return argv

    def _client(self, name: str, *args: str) -> list[str]:
        return [str(self.bindir / name), "-h", "127.0.0.1", "-p", str(self.port), *args]

    def _ready(self) -> bool:
        probe = self._client("pg_isready", "-U", SUPERUSER, "-d", "postgres", "-t", "1")
        done = subprocess.run(
            probe,
            check=False,
            capture_output=True,
            env=self.environment(),
            timeout=CLIENT_TIMEOUT_S,
        )
        return done.returncode == 0

    def _created(self) -> None:
        createdb = self._client("createdb", "-U", SUPERUSER, self.database)
        run(createdb, env=self.environment(), cwd=self.base)

    def sql(self, *statements: str) -> str:
        """Run statements in the `postgres` database with `psql`; their output, unaligned."""
        argv = self._client("psql", "-U", SUPERUSER, "-d", "postgres", "-XAtq")
        argv += ["-v", "ON_ERROR_STOP=1"]
        for statement in statements:
            argv += ["-c", statement]
        return run(argv, env=self.environment(), cwd=self.base)

    def stop_immediately(self) -> None:
        """An immediate shutdown (SIGQUIT): sessions cut, no checkpoint; crash recovery at the
        next start. What a failover follows when a primary's host goes away."""
        if self._proc is None or self._proc.poll() is not None:
            return
        self._proc.send_signal(signal.SIGQUIT)
        try:
            self._proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.kill()


class PostgresStandby(PrivatePostgres):
    """A streaming standby of a private primary: `pg_basebackup -R` of it (which writes
    `standby.signal` and `primary_conninfo`) into a directory of its own, on a port of its own,
    through a replication slot so that the primary keeps the WAL it has not received."""

    kind = "PostgreSQL standby"

    def __init__(self, primary: PrivatePostgres, *, startup_timeout: float = 60.0) -> None:
        super().__init__(database=primary.database, startup_timeout=startup_timeout)
        self.primary = primary
        self.slot = f"standby_{self.port}"

    def _prepare(self) -> None:
        if self.run_as is not None:
            os.chown(self.base, self.run_as.uid, self.run_as.gid)
        backup = self.primary._client("pg_basebackup", "-U", SUPERUSER, "-D", str(self.data_dir))
        backup += ["--write-recovery-conf", "--wal-method=stream", "--checkpoint=fast"]
        backup += ["--create-slot", f"--slot={self.slot}", "--no-sync"]
        run(backup, env=self.environment(), cwd=self.base, run_as=self.run_as)

    def _created(self) -> None:
        """Nothing to create: the database came with the base backup."""

    def promote(self) -> None:
        """Make it a primary (`pg_ctl promote`), and return once it takes writes."""
        promote = [str(self.bindir / "pg_ctl"), "promote", "-D", str(self.data_dir), "-w"]
        promote += ["-t", str(int(self.startup_timeout))]
        run(promote, env=self.environment(), cwd=self.base, run_as=self.run_as)


class ReplicatedPostgres:
    """A private primary and its streaming standby, for a failover under load:

        with ReplicatedPostgres() as pair:
            ...  # point processes at pair.url: both hosts, target_session_attrs=read-write
            pair.primary.stop_immediately()  # or .stop(), .kill()
            pair.standby.promote()

    With `synchronous` (the default) the primary waits for every commit to be applied on the
    standby before it answers (`synchronous_standby_names = '*'`, `synchronous_commit =
    remote_apply`): a write the primary acknowledged survives its loss. It is set once the
    standby streams, since a synchronous primary without its standby takes no commit at all."""

    def __init__(self, *, database: str = "orderflow", synchronous: bool = True) -> None:
        self.synchronous = synchronous
        self.primary = PrivatePostgres(database=database)
        self.standby = PostgresStandby(self.primary)

    @property
    def url(self) -> str:
        hosts = f"127.0.0.1:{self.primary.port},127.0.0.1:{self.standby.port}"
        return f"postgresql://{SUPERUSER}@{hosts}/{self.primary.database}" + (
            "?target_session_attrs=read-write"
        )

    def __enter__(self) -> Self:
        try:
            self.primary.__enter__()
            self.standby.__enter__()
            if self.synchronous:
                self.primary.sql(
                    "ALTER SYSTEM SET synchronous_standby_names = '*'",
                    "ALTER SYSTEM SET synchronous_commit = 'remote_apply'",
                    "SELECT pg_reload_conf()",
                )
                self.primary.wait_until(self._synchronous, "the standby did not become synchronous")
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        try:
            self.standby.close()
        finally:
            self.primary.close()

    def _synchronous(self) -> bool:
        states = self.primary.sql("SELECT sync_state FROM pg_stat_replication")
        return "sync" in states.split()
