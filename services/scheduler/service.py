"""The scheduler process: a starter that claims due orders, one task per claimed order."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

from services.scheduler.compensator import Compensator
from services.scheduler.context import (
    AttemptContext,
    attempt_rules,
    step_series_from_the_start,
)
from services.scheduler.leader_watch import LeaderWatch
from services.scheduler.runner import OrderRunner
from shared.backoff import Backoff
from shared.bootstrap import Runtime
from shared.broker.private import PrivateQueue, ReplyRouter
from shared.crash import crash_point
from shared.domain.models import StateRecord
from shared.domain.states import ProcessState
from shared.domain.timing import utcnow
from shared.errors import ServiceUnavailable, one_line
from shared.metrics import CLAIMS, INFLIGHT
from shared.store.port import ArrivalWatch
from shared.tracing import order_span

log = logging.getLogger(__name__)

QUICK_POLL_S = 0.02
"""Without an arrival watch (a store that cannot watch, or a watch lost), how soon a starter
looks again after a claim that found orders (but not a full batch): while orders keep arriving
it looks every 20 ms, so an order waits 10 ms for its claim on average, not half the poll
interval; each empty look doubles the wait, up to the poll interval."""

CLAIM_GAP_S = 0.05
"""The least time between two claims of a starter that arrivals woke: an order arriving after a
quiet spell is claimed at once; under a steady stream, the orders that arrive within the gap go
in one claim, and their steps to the agents together, which costs every process less per order
than a claim each (decision:claim-gap-50-ms)."""

WATCH_RETRY_S = 1.0
"""How often a starter tries again to watch for arrivals after a watch was lost."""

Attempt = Callable[[StateRecord], Awaitable[None]]


class Scheduler:
    def __init__(self, runtime: Runtime) -> None:
        self._rt = runtime
        self._settings = runtime.settings
        self.name = runtime.name
        step_series_from_the_start()
        self._router = ReplyRouter(runtime.senders("scheduler"))
        self._replies = PrivateQueue(
            runtime.connection,
            runtime.names.reply_queue(f"scheduler-{uuid.uuid4().hex[:6]}"),
            self._router.deliver,
            max_bytes=self._settings.broker.max_message_bytes,
        )
        self._tasks: set[asyncio.Task[None]] = set()
        self._report = runtime.reporter()
        self._room = asyncio.Event()
        self._arrived = asyncio.Event()
        """Set by the store's arrival watch when a new order's state record is inserted."""
        self._watch: ArrivalWatch | None = None
        self._watch_due = 0.0
        self._claimed_at = -CLAIM_GAP_S
        """Loop time of the last claim of new orders."""
        self._undo_due = 0.0
        """Loop time of the next look for compensations."""
        self._room_wanted = 1
        """How much room the starter waits for."""
        self.started = 0

    def status(self) -> dict[str, Any]:
        """This scheduler's part of its heartbeat."""
        return {"inflight": len(self._tasks), "started": self.started}

    async def run(self, stop: asyncio.Event, *, burst: bool = False) -> None:
        """Claim and run orders until `stop`; in `burst` mode, until none is due and every
        attempt started has ended."""
        await self._replies.start()
        ctx = AttemptContext(
            store=self._rt.store,
            publisher=self._rt.publisher,
            names=self._rt.names,
            router=self._router,
            reply_queue=self._replies.name,
            report=self._rt.reporter(),
            rules=attempt_rules(self._settings),
        )
        compensator = Compensator(ctx)
        runner = OrderRunner(ctx, compensator)
        log.info("scheduler ready", extra={"reply_queue": self._replies.name})
        try:
            await self._starter(runner, compensator, stop, burst=burst)
        finally:
            await self._drain()
            await self._replies.stop()
            if self._watch is not None:
                await self._watch.close()

    async def _starter(
        self, runner: OrderRunner, compensator: Compensator, stop: asyncio.Event, *, burst: bool
    ) -> None:
        limit = self._settings.scheduler.scheduler_inflight
        batch = self._settings.scheduler.claim_batch
        # Under a backlog a full scheduler waits for room for `gather` orders before it claims:
        # one claim, one order read and one history append for several orders, however many
        # schedulers share the backlog. Without one, it claims whatever room it has at once.
        gather = max(1, min(limit, batch) // 5)
        backlog = False
        loop = asyncio.get_running_loop()
        pauses = Backoff(first=0.4, cap=5.0)
        idle = Backoff(
            first=min(QUICK_POLL_S, self._settings.scheduler.poll_interval_s),
            cap=self._settings.scheduler.poll_interval_s,
            jitter=0.0,
        )
        while not stop.is_set():
            await self._keep_watching(loop.time())
            self._room_wanted = gather if backlog else 1
            if limit - len(self._tasks) < self._room_wanted:
                self._room.clear()
                await _wait_any(stop, self._room, timeout=self._settings.scheduler.poll_interval_s)
                continue
            free = limit - len(self._tasks)
            try:
                undo = await self._claim_compensations(min(free, batch), burst=burst)
                for record in undo:
                    self._spawn(compensator.run, record)
                want = min(free - len(undo), batch)
                self._arrived.clear()  # an arrival from now on is one this claim may miss
                self._claimed_at = loop.time()
                claimed = await self._claim(want) if want else []
                pauses.reset()
            except ServiceUnavailable as exc:
                log.warning("the store is unavailable; backing off", extra={"error": str(exc)})
                await _wait_any(stop, timeout=pauses.next())
                continue
            except Exception:
                log.exception("claiming failed; backing off")
                await _wait_any(stop, timeout=pauses.next())
                continue
            if burst and not (claimed or undo or self._tasks):
                return  # nothing due, nothing running: the burst is over
            for record in claimed:
                self._spawn(runner.run, record)
            backlog = bool(want) and len(claimed) == want
            if claimed or undo:
                idle.reset()
            if not backlog and not undo:
                await self._rest(stop, idle)

    async def _rest(self, stop: asyncio.Event, idle: Backoff) -> None:
        """Wait for an arrival or the next poll, and at least out the claim gap: the orders
        that arrive meanwhile go in the next claim together."""
        await _wait_any(stop, self._arrived, timeout=self._idle_wait(idle))
        gap = self._claimed_at + CLAIM_GAP_S - asyncio.get_running_loop().time()
        if gap > 0:
            await _wait_any(stop, timeout=gap)

    def _idle_wait(self, idle: Backoff) -> float:
        """How long an idle starter waits for an arrival: the poll interval while a watch tells
        it of each one; without one, shorter while claims keep finding orders."""
        if self._watch is not None and self._watch.alive and self._watch.tells:
            return self._settings.scheduler.poll_interval_s
        return idle.next()

    async def _claim_compensations(self, limit: int, *, burst: bool) -> list[StateRecord]:
        """Compensations first: they finish orders that already hold resources. They are rare,
        so they are looked for once a poll interval unless some were found."""
        loop = asyncio.get_running_loop()
        if not burst and loop.time() < self._undo_due:
            return []
        undo = await self._claim(limit, compensating=True)
        self._undo_due = loop.time() + (0.0 if undo else self._settings.scheduler.poll_interval_s)
        return undo

    async def _keep_watching(self, now: float) -> None:
        """Watch for arrivals (a new order is claimed at once, not at the next poll); a watch
        that died (its connection was lost) is replaced, tried once a second at most. Without
        one the starter polls, and nothing is missed."""
        if self._watch is not None and self._watch.alive:
            return
        if now < self._watch_due:
            return
        self._watch_due = now + WATCH_RETRY_S
        if self._watch is not None:
            with contextlib.suppress(Exception):
                await self._watch.close()
            self._watch = None
        try:
            self._watch = await self._rt.store.watch_arrivals(self._arrived.set)
        except Exception as exc:
            log.warning(
                "cannot watch for new orders; polling for them", extra={"error": one_line(exc)}
            )
        else:
            self._arrived.set()  # whatever arrived while nobody watched

    async def _claim(self, limit: int, *, compensating: bool = False) -> list[StateRecord]:
        now = utcnow()
        claimed = await self._rt.store.claim(
            now=now,
            limit=limit,
            owner=self.name,
            complete_by=now + self._settings.workflow.step_timeout,
            compensating=compensating,
            # Each attempt's ExecutionStarted goes with its claim: no append of its own.
            started_by=None if compensating else self.name,
        )
        CLAIMS.labels("compensation" if compensating else "forward").inc(len(claimed))
        if claimed and not compensating:
            crash_point("after-claim", len(claimed))
        return claimed

    def _spawn(self, run: Attempt, record: StateRecord) -> None:
        self.started += 1
        task = asyncio.create_task(self._guarded(run, record), name=record.locked_by)
        self._tasks.add(task)
        INFLIGHT.set(len(self._tasks))
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        INFLIGHT.set(len(self._tasks))
        # Wake the starter only once there is the room it waits for, not at every finish.
        if self._settings.scheduler.scheduler_inflight - len(self._tasks) >= self._room_wanted:
            self._room.set()

    async def _guarded(self, run: Attempt, record: StateRecord) -> None:
        try:
            # The attempt's span in the order's trace: the steps it asks for nest under it.
            with order_span(
                "compensate" if record.process_state is ProcessState.COMPENSATING else "attempt",
                record.order_id,
                attributes={
                    "orderflow.instance_id": record.locked_by or "",
                    "orderflow.attempt": record.attempt,
                },
            ):
                await run(record)
        except asyncio.CancelledError:
            raise
        except ServiceUnavailable as exc:
            # An outage stopped it (no traceback: it says nothing the error does not).
            log.warning(
                "order attempt stopped by an outage; the supervisor will recover it",
                extra={
                    "order_id": record.order_id,
                    "instance_id": record.locked_by,
                    "error": one_line(exc),
                },
            )
        except Exception:
            # The record keeps its deadline; the supervisor will hand it to another attempt.
            log.exception(
                "order attempt failed",
                extra={"order_id": record.order_id, "instance_id": record.locked_by},
            )

    async def _drain(self) -> None:
        """Stop claiming (done), let running attempts finish within the drain timeout, cancel
        the rest: their records keep their deadlines, and the supervisor recovers them."""
        if not self._tasks:
            return
        log.info("draining", extra={"inflight": len(self._tasks)})
        _, pending = await asyncio.wait(self._tasks, timeout=self._settings.process.drain_timeout_s)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)


async def _wait_any(*events: asyncio.Event, timeout: float) -> None:
    waiters = [asyncio.create_task(e.wait()) for e in events]
    try:
        await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waiters:
            w.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(*waiters, return_exceptions=True)


async def serve_scheduler(runtime: Runtime, stop: asyncio.Event, *, burst: bool = False) -> None:
    if runtime.settings.remote.remote_fence_key is None:
        log.warning(
            "ORDERFLOW_REMOTE_FENCE_KEY is not set: step requests go unsigned, and the remote "
            "service refuses an unsigned fencing token"
        )
    scheduler = Scheduler(runtime)
    watch = LeaderWatch(
        runtime.store,
        runtime.reporter(),
        after=timedelta(seconds=runtime.settings.observability.no_leader_alert_after_s),
    )
    async with runtime.heartbeat("scheduler", scheduler.status, (watch.check,)):
        await scheduler.run(stop, burst=burst)
