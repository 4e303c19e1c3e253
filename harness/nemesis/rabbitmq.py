"""A private RabbitMQ node (and a cluster of them), for a nemesis to stop, crash and restart
(servers.py says how they are used)."""

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
from typing import Any

from harness.nemesis.process import (
    CLIENT_TIMEOUT_S,
    PrivateServer,
    free_port,
    last_lines,
    listening,
)
from shared.errors import ServerError, ServerFailed, ServerMissing


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
