"""One notice delivered to one target, once: claimed in the store's inbox, POSTed with retries,
marked done; or dead-lettered with its reason when the target refuses it for good.

| the target answers                          | the delivery                                  |
|---------------------------------------------|-----------------------------------------------|
| 2xx                                         | delivered, marked done                        |
| 408, 429, 5xx, refused connection, timeout  | tried again with backoff (a `Retry-After` is  |
|                                             | waited instead), until `notify_give_up_after_s`|
|                                             | then dead-lettered (`gave-up`)                |
| any other 4xx, a redirect                   | dead-lettered at once (`refused`)             |

The inbox (the same the consumers dedupe messages with, one "queue" per target:
`<hub>.notify.<target>`) holds the notice's key (`alert_id/event`) while it is delivered and
keeps it, done, for `ORDERFLOW_INBOX_TTL_S`: the same notice again in that time is not sent
again. A notifier that dies mid-delivery leaves its claim; the same notifier (by `--name`)
takes it again at once, another one after it expired. So a notice is sent at least once, and
twice only when a notifier died between the target's answer and marking it done.
"""

from __future__ import annotations

import asyncio
import email.utils
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import timedelta
from enum import StrEnum

import aiohttp
from prometheus_client import Counter
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception_type,
    wait_exponential_jitter,
)

from services.notifier.formats import Notice
from services.notifier.targets import Target
from shared import clock
from shared.backoff import stop_after
from shared.config import NotifierSettings
from shared.domain.coordination import InboxOutcome
from shared.domain.timing import utcnow
from shared.errors import TargetRefused, TargetUnavailable, one_line
from shared.metrics import REGISTRY
from shared.store.port import Inbox, InboxClaim, InboxDone

log = logging.getLogger(__name__)

NOTIFICATIONS = Counter(
    "orderflow_notifications",
    "Notices the notifier finished with, by target, event (trigger, acknowledge, resolve) and "
    "outcome: delivered, duplicate (sent before), dead_lettered.",
    ["target", "event", "outcome"],
    registry=REGISTRY,
)
NOTIFICATION_FAILURES = Counter(
    "orderflow_notification_failures",
    "Tries of a delivery that failed, by target and why: unreachable, timeout, http-<status>.",
    ["target", "reason"],
    registry=REGISTRY,
)
RESPONSE_SHOWN = 300
"""Characters of a target's answer kept in a log line or a dead letter's reason."""


class Outcome(StrEnum):
    DELIVERED = "delivered"
    DUPLICATE = "duplicate"
    """Sent before (within the inbox's window): not sent again."""
    DEAD_LETTERED = "dead_lettered"
    BUSY = "busy"
    """Another notifier is delivering it right now: try again once its claim expired."""


DeadLetter = Callable[[Target, Notice, str, str], Awaitable[None]]
"""Set a notice aside for a target: (target, notice, reason, error)."""


def retry_after(value: str | None) -> float | None:
    """Seconds a `Retry-After` header asks for (delta-seconds or an HTTP date); None: none."""
    if not value:
        return None
    text = value.strip()
    if text.isdigit():
        return float(text)
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        return None
    return max(0.0, (when - utcnow()).total_seconds())


def inbox_queue(hub: str, target: Target) -> str:
    """The inbox "queue" a target's deliveries are deduplicated in."""
    return f"{hub}.notify.{target.name}"


@dataclass
class Sender:
    """Delivers notices for one notifier process (`holder`)."""

    settings: NotifierSettings
    hub: str
    inbox_ttl_s: float
    """How long a delivered notice is remembered (the broker's dedupe window)."""
    session: aiohttp.ClientSession
    inbox: Inbox
    holder: str
    dead_letter: DeadLetter

    @property
    def _claim_ttl(self) -> timedelta:
        # Longer than one try and the longest pause after it: renewed before every try.
        s = self.settings
        return timedelta(seconds=s.notify_timeout_s + s.notify_retry_max_s + 30)

    async def _claim(self, queue: str, notice: Notice) -> InboxOutcome:
        claim = InboxClaim(notice.key, self.holder, utcnow() + self._claim_ttl)
        [outcome] = await self.inbox.inbox_claim_many(queue, [claim], now=utcnow())
        return outcome

    async def deliver(self, target: Target, notice: Notice) -> Outcome:
        """Deliver `notice` to `target` unless it was; what became of it. A store failure
        raises (the notice is then not marked, and comes again)."""
        queue = inbox_queue(self.hub, target)
        claimed = await self._claim(queue, notice)
        if claimed is not InboxOutcome.CLAIMED:
            outcome = Outcome.DUPLICATE if claimed is InboxOutcome.DUPLICATE else Outcome.BUSY
            return self._counted(target, notice, outcome)
        try:
            outcome = await self._send(queue, target, notice)
        except BaseException:
            # Not delivered (store down, stopping): let the next try have it at once.
            try:
                await self.inbox.inbox_release(queue, notice.key, holder=self.holder)
            except Exception as exc:
                log.warning("inbox claim not released", extra={"error": one_line(exc)})
            raise
        if outcome is not Outcome.BUSY:
            keep = utcnow() + timedelta(seconds=self.inbox_ttl_s)
            await self.inbox.inbox_complete_many(queue, [InboxDone(notice.key, self.holder, keep)])
        return self._counted(target, notice, outcome)

    def _counted(self, target: Target, notice: Notice, outcome: Outcome) -> Outcome:
        if outcome is not Outcome.BUSY:
            NOTIFICATIONS.labels(target.name, notice.event.value, outcome.value).inc()
        log.info(
            f"notice {outcome.value}",
            extra={
                "target": target.name,
                "alert_id": notice.alert.alert_id,
                "notice": notice.event.value,
            },
        )
        return outcome

    async def _send(self, queue: str, target: Target, notice: Notice) -> Outcome:
        give_up = self.settings.notify_give_up_after_s
        deadline = clock.monotonic() + give_up
        retrying = AsyncRetrying(
            stop=stop_after(give_up),
            wait=self._pause(deadline),
            retry=retry_if_exception_type(TargetUnavailable),
            reraise=True,
        )
        try:
            async for attempt in retrying:
                with attempt:
                    if attempt.retry_state.attempt_number > 1:
                        # Keep the claim ahead of this try (the same holder takes it again).
                        again = await self._claim(queue, notice)
                        if again is not InboxOutcome.CLAIMED:
                            return Outcome.BUSY
                    await self._post(target, notice)
        except TargetRefused as exc:
            await self.dead_letter(target, notice, exc.reason, str(exc))
            return Outcome.DEAD_LETTERED
        except TargetUnavailable as exc:
            why = f"still failing after {give_up:g}s: {exc}"
            await self.dead_letter(target, notice, "gave-up", why)
            return Outcome.DEAD_LETTERED
        return Outcome.DELIVERED

    def _pause(self, deadline: float) -> Callable[[RetryCallState], float]:
        backoff = wait_exponential_jitter(multiplier=0.5, max=self.settings.notify_retry_max_s)

        def pause(state: RetryCallState) -> float:
            error = state.outcome.exception() if state.outcome is not None else None
            asked = error.retry_after_s if isinstance(error, TargetUnavailable) else None
            wanted = asked if asked is not None else backoff(state)
            # Never past the give-up time: the last try comes just before it.
            return max(0.0, min(wanted, deadline - clock.monotonic()))

        return pause

    async def _post(self, target: Target, notice: Notice) -> None:
        url = target.url.get_secret_value()
        timeout = aiohttp.ClientTimeout(total=self.settings.notify_timeout_s)
        try:
            async with self.session.post(
                url, json=target.body(notice), timeout=timeout, allow_redirects=False
            ) as response:
                status = response.status
                answer = (await response.content.read(RESPONSE_SHOWN)).decode("utf-8", "replace")
                wait = retry_after(response.headers.get("Retry-After"))
        except TimeoutError:
            self._failed(target, "timeout")
            raise TargetUnavailable(
                f"{target.shown} did not answer within {self.settings.notify_timeout_s:g}s"
            ) from None
        except (aiohttp.ClientError, OSError) as exc:
            self._failed(target, "unreachable")
            # An error's text may hold the URL, and the URL a secret: say only what failed.
            raise TargetUnavailable(f"{target.shown} unreachable ({type(exc).__name__})") from None
        if 200 <= status < 300:
            return
        self._failed(target, f"http-{status}")
        said = f"{target.shown} answered {status}: {answer.strip()[:RESPONSE_SHOWN]!r}"
        if status in (408, 429) or status >= 500:
            raise TargetUnavailable(said, retry_after_s=wait)
        raise TargetRefused(said)

    @staticmethod
    def _failed(target: Target, reason: str) -> None:
        NOTIFICATION_FAILURES.labels(target.name, reason).inc()
        log.warning("delivery failed", extra={"target": target.name, "reason": reason})


async def deliver_all(sender: Sender, targets: list[Target], notice: Notice) -> list[Outcome]:
    """`notice` delivered to every target side by side (a slow one holds up no other)."""
    done = await asyncio.gather(
        *(sender.deliver(t, notice) for t in targets), return_exceptions=True
    )
    for result in done:
        if isinstance(result, BaseException):
            raise result  # after every target's delivery finished: none is left running
    return [r for r in done if isinstance(r, Outcome)]
