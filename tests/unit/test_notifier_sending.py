"""One delivery to one target (services/notifier/sending.py) against a real local HTTP server,
with the memory store's inbox: retried on 429 after its `Retry-After`, dead-lettered at once
on a 400, given up after its bounded time, sent once however often it is asked."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from pydantic import SecretStr

from services.notifier.formats import Event, Notice, TargetKind
from services.notifier.sending import Outcome, Sender
from services.notifier.targets import Target
from shared.config import Settings
from shared.domain.journal import Alert, AlertKind, Severity
from shared.store.memory import MemoryStore
from tests.support.topology import free_port

ALERT = Alert(
    alert_id="a-1",
    kind=AlertKind.NO_LEADER,
    severity=Severity.CRITICAL,
    message="no supervisor leads",
    at=datetime(2026, 12, 4, tzinfo=UTC),
)


@dataclass
class Receiver:
    """Answers each request with the next of `answers` (then 200), and notes when it came."""

    answers: list[tuple[int, dict[str, str]]] = field(default_factory=list)
    times: list[float] = field(default_factory=list)
    bodies: list[object] = field(default_factory=list)

    async def handle(self, request: web.Request) -> web.Response:
        self.times.append(time.monotonic())
        self.bodies.append(await request.json())
        status, headers = self.answers.pop(0) if self.answers else (200, {})
        return web.Response(status=status, headers=headers, text=f"answer {status}")


@dataclass
class Rig:
    receiver: Receiver
    sender: Sender
    target: Target
    dead: list[tuple[str, str]]


@pytest.fixture
async def rig() -> AsyncIterator[Rig]:
    receiver = Receiver()
    app = web.Application()
    app.router.add_post("/hook", receiver.handle)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    settings = Settings(
        hub="h", notify_retry_max_s=0.05, notify_give_up_after_s=1.5, notify_timeout_s=2
    )
    dead: list[tuple[str, str]] = []

    async def dead_letter(target: Target, notice: Notice, reason: str, error: str) -> None:
        dead.append((reason, error))

    target = Target(TargetKind.WEBHOOK, SecretStr(str(server.make_url("/hook"))))
    async with aiohttp.ClientSession() as session:
        sender = Sender(
            settings.notifier,
            settings.hub,
            settings.broker.inbox_ttl_s,
            session,
            MemoryStore(),
            "notifier-1",
            dead_letter,
        )
        yield Rig(receiver, sender, target, dead)
    await server.close()


async def test_a_429_is_tried_again_after_its_retry_after(rig: Rig) -> None:
    rig.receiver.answers = [(429, {"Retry-After": "1"}), (503, {})]
    assert await rig.sender.deliver(rig.target, Notice("h", ALERT)) is Outcome.DELIVERED
    first, second, third = rig.receiver.times
    assert second - first >= 0.95, "the Retry-After was waited for"
    assert third - second < 0.9, "without one: the backoff (here at most 0.05s)"
    assert rig.dead == []


async def test_a_notice_is_sent_once_however_often_it_comes(rig: Rig) -> None:
    notice = Notice("h", ALERT)
    assert await rig.sender.deliver(rig.target, notice) is Outcome.DELIVERED
    assert await rig.sender.deliver(rig.target, notice) is Outcome.DUPLICATE
    assert len(rig.receiver.bodies) == 1
    # Its acknowledgement is another notice.
    ack = Notice("h", ALERT, Event.ACKNOWLEDGE, by="ann")
    assert await rig.sender.deliver(rig.target, ack) is Outcome.DELIVERED
    assert len(rig.receiver.bodies) == 2


@pytest.mark.parametrize("status", [400, 404, 410, 307])
async def test_a_refusal_for_good_is_dead_lettered_at_once(rig: Rig, status: int) -> None:
    rig.receiver.answers = [(status, {"Location": "/elsewhere"})]
    notice = Notice("h", ALERT)
    assert await rig.sender.deliver(rig.target, notice) is Outcome.DEAD_LETTERED
    assert len(rig.receiver.times) == 1, "never tried again"
    [(reason, error)] = rig.dead
    assert reason == "refused" and f"answered {status}" in error
    # Dead-lettered is done: the same notice again is not sent, nor dead-lettered again.
    assert await rig.sender.deliver(rig.target, notice) is Outcome.DUPLICATE
    assert len(rig.dead) == 1


async def test_a_target_down_for_longer_than_the_give_up_time_is_dead_lettered(rig: Rig) -> None:
    down = Target(TargetKind.WEBHOOK, SecretStr(f"http://127.0.0.1:{free_port()}/x?token=s3cret"))
    started = time.monotonic()
    assert await rig.sender.deliver(down, Notice("h", ALERT)) is Outcome.DEAD_LETTERED
    assert 1.4 <= time.monotonic() - started < 5, "tried until the give-up time, not past it"
    [(reason, error)] = rig.dead
    assert reason == "gave-up" and "unreachable" in error and "s3cret" not in error
