"""`orderflow watch` opens its connections for each refresh and closes them before it shows it
(services/cli/inspect.py `stats_every`): a server that is away at a refresh ends the watch with
the reason and exit 3, where one connection kept for the whole watch would wait for the server
and leave a stale view on the screen; a server that went away and came back between two
refreshes goes unnoticed.

The servers are the memory adapters, opened where `open_operations` opens the real ones
(services/operator/operations.py); a server that is away is the real adapter refusing to
connect to a port nothing listens on, so the reason is the one an operator would read.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from click.testing import CliRunner

from services.cli.inspect import stats_every
from services.cli.main import EXIT_UNAVAILABLE, main
from services.operator import operations
from shared import bootstrap
from shared.broker.memory import MemoryBroker, connect
from shared.broker.topology import Names
from shared.config import Settings
from shared.store.memory import MemoryStore
from shared.store.port import StateStore

AWAY_BROKER = "amqp://guest:guest@127.0.0.1:1/"
AWAY_STORE = "postgresql://postgres@127.0.0.1:1/test"
"""Where the real adapters find nothing listening: what a server that is away looks like."""


class ClosedCountingStore(MemoryStore):
    """The memory store, counting its closes (each open hands out this one store)."""

    closed = 0

    async def close(self) -> None:
        self.closed += 1


@dataclass
class Servers:
    """The broker and the store of a watch, each away at the opens (1st, 2nd, …) in `away`."""

    broker: MemoryBroker = field(default_factory=MemoryBroker)
    store: ClosedCountingStore = field(default_factory=ClosedCountingStore)
    away: dict[str, set[int]] = field(default_factory=dict)
    opens: Counter[str] = field(default_factory=Counter)

    def is_away(self, server: str) -> bool:
        self.opens[server] += 1
        return self.opens[server] in self.away.get(server, set())

    async def open_broker(self, settings: Settings, *, name: str) -> Any:
        if self.is_away("broker"):
            away = settings.replace(rabbitmq_url=AWAY_BROKER)
            return await bootstrap.open_broker(away, name=name)
        return connect(self.broker, "guest", name=name)

    async def connect_store(self, settings: Settings) -> StateStore:
        if self.is_away("store"):
            return await bootstrap.connect_store(settings.replace(store_url=AWAY_STORE))
        return self.store


@pytest.fixture
def servers(monkeypatch: pytest.MonkeyPatch, hub: str) -> Iterator[Servers]:
    made = Servers()
    for queue in Names(hub).watched_queues():
        made.broker.declare_queue(queue, owner=None, durable=True)
    monkeypatch.setattr(operations, "open_broker", made.open_broker)
    monkeypatch.setattr(operations, "connect_store", made.connect_store)
    yield made


async def test_each_refresh_is_read_over_connections_closed_before_it_is_shown(
    servers: Servers, hub: str
) -> None:
    settings = Settings(hub=hub)
    shown = 0
    async for snapshot in stats_every(settings, interval=0.01, count=3):
        shown += 1
        assert servers.broker.connections() == [], "a connection outlives its refresh"
        assert (servers.opens["store"], servers.store.closed) == (shown, shown)
        assert set(snapshot.queues.values()) == {0}, snapshot.queues
        if shown == 1:  # away and back before the next refresh: not noticed
            servers.broker.outage(True)
            servers.broker.outage(False)
    assert servers.opens == Counter(broker=3, store=3)


@pytest.mark.parametrize("server", ["broker", "store"])
def test_a_server_away_at_a_refresh_ends_the_watch_with_the_reason(
    servers: Servers, hub: str, server: str
) -> None:
    servers.away[server] = {2}
    watched = CliRunner().invoke(
        main,
        ["--hub", hub, "watch", "--json", "--count", "3", "--interval", "0.2"],
        env={"ORDERFLOW_CONNECT_TIMEOUT_S": "2"},
    )
    shown = watched.stdout.splitlines()
    assert len(shown) == 1, f"the watch went on after the {server} went away: {watched.output}"
    assert json.loads(shown[0])["hub"] == hub
    assert watched.exit_code == EXIT_UNAVAILABLE, watched.output
    reason = "RabbitMQ at" if server == "broker" else "PostgreSQL at"
    [line] = watched.stderr.splitlines()
    assert line.startswith(f"orderflow: error: {reason} ") and "unreachable" in line, line
    assert servers.broker.connections() == []
