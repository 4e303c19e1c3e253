"""`orderflow alerts ack|resolve` with several ids records them all at one moment, read once
for the command (services/cli/inspect.py `_mark`): the alerts an operator took together read
back together, in `alerts list` and in what the notifier tells PagerDuty. (The API's
acknowledge and resolve take one id each.)

The clock moves a second at each read, so a moment read per alert could not pass for one."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest
from click.testing import CliRunner

from services.cli.main import main
from services.operator import operations
from shared import clock
from shared.config import Settings
from shared.domain.journal import Alert, AlertKind, Severity
from shared.store.memory import MemoryStore
from shared.store.port import StateStore

IDS = ["a-1", "a-2", "a-3"]


class SecondPerRead:
    """A wall clock one second further on at each read."""

    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def wall(self) -> float:
        self.now += 1
        return self.now

    def monotonic(self) -> float:
        return time.monotonic()


@pytest.fixture
def store(monkeypatch: pytest.MonkeyPatch) -> Iterator[MemoryStore]:
    """The memory store, where the command opens its store, holding the alerts of IDS."""
    kept = MemoryStore()

    async def raise_alerts() -> None:
        for alert_id in IDS:
            await kept.raise_alert(
                Alert(
                    alert_id=alert_id,
                    kind=AlertKind.ORDER_ERROR,
                    severity=Severity.CRITICAL,
                    message=f"alert {alert_id}",
                    at=clock.utcnow(),
                )
            )

    async def connect_store(settings: Settings) -> StateStore:
        return kept

    asyncio.run(raise_alerts())
    monkeypatch.setattr(operations, "connect_store", connect_store)
    yield kept


@pytest.fixture
def second_per_read() -> Iterator[None]:
    token = clock.CLOCK.set(SecondPerRead())
    yield
    clock.CLOCK.reset(token)


@pytest.mark.usefixtures("second_per_read")
@pytest.mark.parametrize("command", ["ack", "resolve"])
def test_one_command_marks_all_its_alerts_at_one_moment(store: MemoryStore, command: str) -> None:
    marked = CliRunner().invoke(main, ["alerts", command, *IDS, "--by", "ann"])
    assert marked.exit_code == 0, marked.output
    states = asyncio.run(store.alert_states(IDS))
    moments = {
        state.acknowledged_at if command == "ack" else state.resolved_at
        for state in states.values()
    }
    assert len(states) == len(IDS) and len(moments) == 1, moments
    [moment] = moments
    assert moment is not None
    at = f" at {moment.isoformat()}"
    said = marked.stdout.splitlines()
    assert len(said) == len(IDS) and all(line.endswith(at) for line in said), said
