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

The PostgreSQL ones are postgres.py, the RabbitMQ ones rabbitmq.py; this module is the one
the nemesis and the tests import them from. Everything here blocks (subprocess calls, waits of
seconds): call it from a thread in async code.
"""

from __future__ import annotations

from harness.nemesis.postgres import PostgresStandby, PrivatePostgres, ReplicatedPostgres
from harness.nemesis.process import PrivateServer, free_port
from harness.nemesis.rabbitmq import PrivateRabbitCluster, PrivateRabbitMQ
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
