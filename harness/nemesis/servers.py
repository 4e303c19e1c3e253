"""Private PostgreSQL and RabbitMQ servers, for a nemesis to stop, crash and restart: never the
machine's own, which other work on the machine uses.

Each lives in a temporary directory of its own, on free ports of 127.0.0.1, watched so that no
orphan outlives a crashed run (process.py), and is removed on leaving its `with`:

    with PrivatePostgres() as store, PrivateRabbitMQ() as broker:
        ...  # point processes at store.url and broker.url
        broker.stop_app()  # every connection dropped; the node stays
        broker.start_app()
        store.restart()  # the same port, the same data
        store.kill()  # a crash: SIGKILL of every server process
        store.start()  # crash recovery

Everything here blocks (subprocess calls, waits of seconds): call it from a thread in async code.
"""

from __future__ import annotations

import json
import os
import pwd
import secrets
import shutil
import signal
import subprocess
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, suppress
from pathlib import Path
from typing import Any, Self

from harness.nemesis.process import (
    CLIENT_TIMEOUT_S,
    STOP_TIMEOUT_S,
    PrivateServer,
    RunAs,
    free_port,
    last_lines,
    listening,
    run,
)
from shared.errors import ServerError, ServerFailed, ServerMissing

__all__ = [
    "PostgresStandby",
    "PrivatePostgres",
    "PrivateRabbitCluster",
    "PrivateRabbitMQ",
    "PrivateServer",
    "ReplicatedPostgres",
    "ServerError",
    "ServerFailed",
    "ServerMissing",
    "free_port",
]

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


def rabbitmq_sbin() -> Path:
    """The directory of RabbitMQ's own scripts (`rabbitmq-server` beside `rabbitmq-env`). Not
    Debian's /usr/sbin wrapper: as root that one re-runs everything as the `rabbitmq` user."""
    candidates = [shutil.which("rabbitmq-server"), "/usr/lib/rabbitmq/bin/rabbitmq-server"]
    for candidate in candidates:
        if candidate is None or not Path(candidate).exists():
            continue
        sbin = Path(os.path.realpath(candidate)).parent
        if (sbin / "rabbitmq-env").is_file() and (sbin / "rabbitmqctl").is_file():
            return sbin
    raise ServerMissing("RabbitMQ's rabbitmq-server and rabbitmqctl are not installed")


def erlang_cookie() -> str:
    """The cookie the machine's `rabbitmqctl` uses (the caller's, else the `rabbitmq` user's): the
    private node shares it, so `rabbitmqctl -n NODE` from a shell reaches that node too. A random
    one if neither is readable (then only `ctl` reaches it)."""
    homes = [Path.home()]
    with suppress(KeyError):
        homes.append(Path(pwd.getpwnam("rabbitmq").pw_dir))
    for home in homes:
        with suppress(OSError):
            cookie = (home / ".erlang.cookie").read_text().strip()
            if cookie:
                return cookie
    return secrets.token_hex(20).upper()


class PrivateRabbitMQ(PrivateServer):
    """A RabbitMQ node of its own: its node name, AMQP and distribution ports, data directory,
    configuration and (empty) plugins file; the default guest user, on 127.0.0.1 only."""

    kind = "RabbitMQ"
    stop_signal = signal.SIGTERM  # rabbitmq-server's trap: a clean shutdown of the node
    foreign_environment = ("RABBITMQ_",)

    def __init__(self, *, startup_timeout: float = 90.0, cookie: str | None = None) -> None:
        super().__init__(startup_timeout=startup_timeout)
        self.cookie = cookie
        """The Erlang cookie (the nodes of a cluster share one); None: `erlang_cookie()`."""
        self.sbin = rabbitmq_sbin()
        self.node = f"orderflow-{secrets.token_hex(4)}@localhost"
        # Set explicitly: by default it is the AMQP port + 20000, which may be taken.
        self.dist_port = free_port()
        while self.dist_port == self.port:
            self.dist_port = free_port()

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}/"

    def _prepare(self) -> None:
        (self.base / "rabbitmq.conf").write_text(f"listeners.tcp.1 = 127.0.0.1:{self.port}\n")
        # Its own, so that the machine's rabbitmq-env.conf (its NODENAME) is not read.
        (self.base / "rabbitmq-env.conf").write_text("# settings: in the environment\n")
        (self.base / "enabled_plugins").write_text("[].\n")
        home = self.base / "home"
        home.mkdir()
        cookie = os.open(home / ".erlang.cookie", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o400)
        with os.fdopen(cookie, "w") as f:
            f.write(self.cookie or erlang_cookie())

    def _settings(self) -> dict[str, str]:
        base = self.base
        return {
            "HOME": str(base / "home"),  # its .erlang.cookie, for the node and for `ctl`
            "RABBITMQ_NODENAME": self.node,
            "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
            "RABBITMQ_NODE_PORT": str(self.port),
            "RABBITMQ_DIST_PORT": str(self.dist_port),
            "RABBITMQ_MNESIA_BASE": str(base / "mnesia"),
            "RABBITMQ_LOG_BASE": str(base / "log"),
            "RABBITMQ_CONFIG_FILE": str(base / "rabbitmq.conf"),
            "RABBITMQ_ADVANCED_CONFIG_FILE": str(base / "advanced.config"),
            "RABBITMQ_CONF_ENV_FILE": str(base / "rabbitmq-env.conf"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(base / "enabled_plugins"),
            "RABBITMQ_PID_FILE": str(base / "rabbitmq.pid"),
            "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": "-kernel inet_dist_use_interface {127,0,0,1}",
            "ERL_EPMD_ADDRESS": "127.0.0.1",
        }

    def _argv(self) -> list[str]:
        return [str(self.sbin / "rabbitmq-server")]

    def _ready(self) -> bool:
        # Its AMQP listener opens near the end of the boot: polled first, as it is cheap, where
        # each `rabbitmqctl` boots an Erlang VM (a second of the CPU the starting node wants).
        if not listening(self.port):
            return False
        return self.ctl("await_startup", "--timeout", "10", check=False).returncode == 0

    def _discard(self) -> None:
        # Its data is about to be removed: a clean shutdown would only cost seconds.
        self.kill()

    def ctl(
        self, *args: str, check: bool = True, timeout: float = CLIENT_TIMEOUT_S
    ) -> subprocess.CompletedProcess[str]:
        """`rabbitmqctl -n NODE ARGS…`; with `check`, ServerFailed unless it succeeds."""
        argv = [str(self.sbin / "rabbitmqctl"), "-n", self.node, *args]
        try:
            done = subprocess.run(
                argv,
                check=False,
                capture_output=True,
                text=True,
                env=self.environment(),
                cwd=self.base,
                timeout=timeout,
            )
        except subprocess.TimeoutExpired:
            raise ServerFailed(f"rabbitmqctl {' '.join(args)} timed out on {self.node}") from None
        if check and done.returncode != 0:
            raise ServerFailed(
                f"rabbitmqctl {' '.join(args)} failed on {self.node} (exit {done.returncode}): "
                f"{last_lines(done.stderr or done.stdout, 3)}"
            )
        return done

    def stop_app(self) -> None:
        """Stop the RabbitMQ application: every connection dropped, the node (Erlang VM) stays."""
        self.ctl("stop_app")

    def start_app(self) -> None:
        """Start the application again; return once it takes connections."""
        self.ctl("start_app", timeout=self.startup_timeout)
        self.ctl("await_startup", "--timeout", str(int(self.startup_timeout)))


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


class PrivateRabbitCluster:
    """`size` private RabbitMQ nodes (each its own node name, AMQP and distribution ports, data
    directory and configuration; one Erlang cookie) joined in one cluster with `rabbitmqctl
    join_cluster`. `url` lists every node's AMQP URL, as ORDERFLOW_RABBITMQ_URL takes them.

        with PrivateRabbitCluster() as cluster:
            leader = cluster.node(cluster.leaders()["hub.orders"])
            leader.kill()  # a crash of one node; the others carry on
            leader.start()  # it rejoins the cluster from its data
    """

    def __init__(self, *, size: int = 3, startup_timeout: float = 120.0) -> None:
        cookie = secrets.token_hex(20).upper()
        self.nodes = [
            PrivateRabbitMQ(startup_timeout=startup_timeout, cookie=cookie) for _ in range(size)
        ]
        self._stack = ExitStack()

    @property
    def url(self) -> str:
        return ",".join(node.url for node in self.nodes)

    def __enter__(self) -> PrivateRabbitCluster:
        try:
            # Booted side by side: each takes 10 to 30 s, mostly waiting.
            with ThreadPoolExecutor(len(self.nodes)) as pool:
                booted = list(pool.map(self._boot, self.nodes))
            for node in booted:
                if node is not None:  # one that failed removed itself already
                    self._stack.callback(node.close)
            if not all(booted):
                raise ServerFailed("a node of the private RabbitMQ cluster did not start")
            first = self.nodes[0]
            for node in self.nodes[1:]:
                node.ctl("stop_app")
                node.ctl("join_cluster", first.node, timeout=node.startup_timeout)
                node.start_app()
            running = self.running_nodes()
            if running != {n.node for n in self.nodes}:
                raise ServerFailed(f"the private cluster runs only {sorted(running)}")
        except BaseException:
            self._stack.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    @staticmethod
    def _boot(node: PrivateRabbitMQ) -> PrivateRabbitMQ | None:
        try:
            return node.__enter__()
        except ServerError:
            return None

    def node(self, name: str) -> PrivateRabbitMQ:
        """The node of this Erlang node name (`orderflow-…@localhost`)."""
        for node in self.nodes:
            if node.node == name:
                return node
        raise KeyError(name)

    def _any_running(self) -> PrivateRabbitMQ:
        for node in self.nodes:
            if node.running and listening(node.port):
                return node
        raise ServerFailed("no node of the private RabbitMQ cluster is running")

    def running_nodes(self) -> set[str]:
        done = self._any_running().ctl("cluster_status", "--formatter", "json")
        return set(json.loads(done.stdout)["running_nodes"])

    def queues(self) -> list[dict[str, Any]]:
        """Every queue of the default virtual host: `name`, `durable`, `type`, `leader`,
        `members`."""
        done = self._any_running().ctl(
            "list_queues", "name", "durable", "type", "leader", "members", "--formatter", "json"
        )
        return list(json.loads(done.stdout))

    def diagnosis(self, *, lines: int = 40) -> str:
        """What a failed test prints about the cluster: its running nodes, every queue's
        leader, online members, consumers and depths, and the end of each node's own log.
        Never raises: a diagnosis must not hide the failure it explains."""
        parts: list[str] = []
        try:
            parts.append(f"running nodes: {sorted(self.running_nodes())}")
            done = self._any_running().ctl(
                "list_queues",
                "name",
                "type",
                "leader",
                "online",
                "consumers",
                "messages_ready",
                "messages_unacknowledged",
                "--formatter",
                "json",
                check=False,
                timeout=10,
            )
            parts.append(f"queues: {done.stdout.strip() or done.stderr.strip()}")
        except Exception as exc:
            parts.append(f"cluster state unavailable: {exc}")
        for node in self.nodes:
            try:
                for path in sorted((node.base / "log").glob("*.log")):
                    text = path.read_text(errors="replace").splitlines()[-lines:]
                    if text:
                        parts.append(f"--- {node.node} {path.name} ---\n" + "\n".join(text))
            except (OSError, ServerError) as exc:
                parts.append(f"--- {node.node}: no log ({exc})")
        return "\n".join(parts)

    def leaders(self) -> dict[str, str]:
        """The node leading each quorum queue, by queue name."""
        return {
            str(q["name"]): str(q["leader"]) for q in self.queues() if q.get("type") == "quorum"
        }
