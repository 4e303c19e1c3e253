"""The decisions of the runner, the compensator, the supervisor and the consumer, driven through
the real processes in burst mode on the memory adapters under virtual time (tests/support/
memory_hub.py): each process runs until it has nothing left to do, so a scenario is a sequence
of bursts, and a deadline a matter of letting virtual time pass."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest

from harness.simulation.shop import Placed
from services.scheduler.compensator import Compensator
from services.scheduler.context import AttemptContext, attempt_rules
from services.scheduler.runner import OrderRunner
from services.scheduler.service import serve_scheduler
from services.submission.service import Submission, serve_submission
from services.supervisor.service import serve_supervisor
from shared.broker.private import PrivateQueue, ReplyRouter
from shared.domain.journal import AlertKind
from shared.domain.journal import HistoryEventType as H
from shared.domain.messages import OrderStatus
from shared.domain.states import ProcessState, StepStatus
from shared.domain.timing import utcnow
from shared.errors import StoreUnavailable
from shared.store.values import InboxClaim
from tests.support.memory_hub import MemoryHub, run

P = ProcessState


async def _history(hub: MemoryHub, order_id: str) -> list[H]:
    return [e.type for e in await hub.store.read_history(order_id)]


def test_an_order_is_processed_by_one_burst_of_each_process() -> None:
    async def scenario(hub: MemoryHub) -> None:
        placed = await hub.place()
        await hub.submission()
        assert (await hub.state(placed)).process_state is P.PENDING
        await hub.scheduler()
        state = await hub.state(placed)
        assert state.process_state is P.PROCESSED and state.locked_by is None
        assert all(s.status is StepStatus.COMPLETED for s in state.steps.values())
        assert [outcome for _, outcome in await hub.effects(placed)] == ["applied"] * 3
        assert H.EXECUTION_COMPLETED in await _history(hub, placed.order_id)
        await hub.sleep(0.1)  # statuses are on their way
        assert placed.statuses == [
            OrderStatus.RECEIVED,
            OrderStatus.PROCESSING,
            OrderStatus.COMPLETED,
        ]

    run(scenario)


def test_copies_of_an_order_message_record_one_order_and_claim_no_inbox_entry() -> None:
    async def scenario(hub: MemoryHub) -> None:
        placed = await hub.place()
        await hub.shop.place(placed)  # the same message again: a publisher's retry
        await hub.submission()
        assert (await hub.state(placed)).process_state is P.PENDING
        assert await _history(hub, placed.order_id) == [H.ORDER_SUBMITTED]
        # The order's insert is the dedupe (decision:orders-deduped-by-order): the orders queue has
        # no inbox.
        assert (await hub.store.record_counts())["inbox"] == 0
        await hub.sleep(0.1)
        # Each copy is told Received, under its stable message id (decision:status-messages).
        assert placed.statuses == [OrderStatus.RECEIVED, OrderStatus.RECEIVED]

    run(scenario)


def test_a_copy_of_an_order_message_after_its_run_began_sends_no_status() -> None:
    async def scenario(hub: MemoryHub) -> None:
        placed = await hub.place()
        await hub.submission()
        await hub.scheduler()
        await hub.sleep(0.1)
        told = list(placed.statuses)
        assert told[-1] is OrderStatus.COMPLETED
        await hub.shop.place(placed)  # a copy, late: a replay, or a publisher's retry
        await hub.submission()
        await hub.sleep(0.1)
        # Nothing added, and no Received after Completed.
        assert placed.statuses == told
        assert (await _history(hub, placed.order_id)).count(H.ORDER_SUBMITTED) == 1
        assert (await hub.state(placed)).process_state is P.PROCESSED

    run(scenario)


def test_an_order_whose_pause_failed_was_told_received_before(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The order that tips the backlog pauses submission; a pause that fails has its message
    handled again, and by then a scheduler may have claimed the order: its Received must have
    gone already (a copy of a claimed order's message sends none)."""

    async def scenario(hub: MemoryHub) -> None:
        failed: list[bool] = []

        async def pause_failing_once(self: Submission) -> None:
            if not failed:
                failed.append(True)
                # A scheduler claims meanwhile, then the broker refuses the cancel.
                now = utcnow()
                await hub.store.claim(
                    now=now, limit=10, owner="scheduler-1", complete_by=now + timedelta(seconds=60)
                )
                raise StoreUnavailable("the broker refused the cancel")

        monkeypatch.setattr(Submission, "_pause", pause_failing_once)
        first, second = await hub.place(), await hub.place()
        runtime = await hub.runtime("submission", backlog_threshold=1)
        await serve_submission(runtime, asyncio.Event(), burst=True)
        await hub.sleep(0.1)
        assert failed, "the second order tipped the backlog"
        assert first.statuses == second.statuses == [OrderStatus.RECEIVED]
        assert (await hub.state(second)).attempt == 1

    run(scenario)


def test_a_declined_payment_is_compensated_in_reverse() -> None:
    async def scenario(hub: MemoryHub) -> None:
        placed = await hub.place()
        await hub.submission()
        await hub.scheduler()
        state = await hub.state(placed)
        assert state.process_state is P.COMPENSATED
        effects = await hub.effects(placed)
        assert ("payment.charge", "declined") in effects or (
            "payment.authorize",
            "declined",
        ) in effects
        assert effects[-1] == ("inventory.release", "applied"), effects
        assert H.COMPENSATION_COMPLETED in await _history(hub, placed.order_id)

    run(scenario, decline_rate=1.0)


def test_transient_failures_give_the_order_back_for_a_later_attempt() -> None:
    async def scenario(hub: MemoryHub) -> None:
        placed = await hub.place()
        await hub.submission()
        await hub.scheduler()
        state = await hub.state(placed)
        assert state.process_state is P.PENDING and state.locked_by is None
        assert state.failure_count >= 1 and state.next_attempt_at is not None
        assert state.next_attempt_at > utcnow(), "released with a backoff"
        spent = state.retry_budget.used
        assert spent == state.failure_count * hub.settings.agents.agent_attempts_per_request, (
            "each attempt spent the agent's allowance, and no more"
        )
        hub.faults.transient_error_rate = 0.0
        await _until_due(hub, placed)
        await hub.scheduler()
        assert (await hub.state(placed)).process_state is P.PROCESSED

    run(scenario, transient_error_rate=1.0)


async def _until_due(hub: MemoryHub, placed: Placed) -> None:
    """Let time pass until the order may be claimed again (its backoff is over)."""
    state = await hub.state(placed)
    assert state.next_attempt_at is not None
    await hub.sleep(max(0.0, (state.next_attempt_at - utcnow()).total_seconds()) + 0.01)


async def _claim_and_die(hub: MemoryHub, scheduler: str = "dead-scheduler") -> None:
    """A scheduler that claims every due order and dies before it does anything else."""
    now = utcnow()
    claimed = await hub.store.claim(
        now=now, limit=100, owner=scheduler, complete_by=now + hub.settings.workflow.step_timeout
    )
    assert claimed


def test_the_supervisor_recovers_an_expired_attempt_and_parks_it_at_the_threshold() -> None:
    async def scenario(hub: MemoryHub) -> None:
        placed = await hub.place()
        await hub.submission()
        past_deadline = hub.settings.workflow.step_timeout_s + hub.settings.process.clock_skew_s + 1
        for failures in range(1, hub.settings.supervisor.failure_threshold + 1):
            await _until_due(hub, placed)
            await _claim_and_die(hub)
            await hub.supervisor()  # not expired yet: nothing to recover
            assert (await hub.state(placed)).process_state is P.PROCESSING
            await hub.sleep(past_deadline)
            await hub.supervisor()
            state = await hub.state(placed)
            assert state.failure_count == failures
        assert state.process_state is P.ERROR and state.locked_by is None
        assert H.RECOVERED in await _history(hub, placed.order_id)
        alerts = await hub.store.list_alerts(limit=10)
        assert [a.kind for a in alerts] == [AlertKind.ORDER_ERROR]

    run(scenario)


def test_only_the_supervisor_holding_the_lease_recovers() -> None:
    async def scenario(hub: MemoryHub) -> None:
        placed = await hub.place()
        await hub.submission()
        # Rounds far apart (the lease outlasts them): the leader's next round comes well after
        # the attempt expired, and a standby's round in between must leave it alone.
        slow = {"supervisor_interval_s": 30.0, "lease_ttl_s": 60.0}
        leader = await hub.runtime("supervisor", "supervisor-1", **slow)
        stop = asyncio.Event()
        leading = asyncio.create_task(serve_supervisor(leader, stop))  # takes the lease
        await hub.sleep(1)
        await _claim_and_die(hub)
        await hub.sleep(
            hub.settings.workflow.step_timeout_s + hub.settings.process.clock_skew_s + 1
        )
        await hub.supervisor("supervisor-2", **slow)  # a round as a standby: recovers nothing
        assert (await hub.state(placed)).process_state is P.PROCESSING
        await hub.sleep(30)  # the leader's next round
        stop.set()
        await leading
        recovered = [
            e.data["by"]
            for e in await hub.store.read_history(placed.order_id)
            if e.type is H.RECOVERED
        ]
        assert recovered == ["supervisor-1"]

    run(scenario)


def test_a_superseded_attempt_stops_without_a_write() -> None:
    async def scenario(hub: MemoryHub) -> None:
        placed = await hub.place()
        await hub.submission()
        await _claim_and_die(hub)
        stale = await hub.state(placed)
        await hub.sleep(
            hub.settings.workflow.step_timeout_s + hub.settings.process.clock_skew_s + 1
        )
        await hub.supervisor()
        await _until_due(hub, placed)
        await hub.scheduler()  # a later attempt completes the order
        done = await hub.state(placed)
        assert done.process_state is P.PROCESSED and done.attempt == stale.attempt + 1
        # The stale attempt wakes up, as in a scheduler that was paused (a long GC, a frozen VM).
        async with hub.agents():
            await (await _runner(hub)).run(stale)
        assert await hub.state(placed) == done, "the stale attempt changed the record"
        assert (await _history(hub, placed.order_id))[-1] is H.LEASE_LOST
        assert len(await hub.effects(placed)) == 3

    run(scenario)


def test_a_request_delivered_twice_is_handled_once() -> None:
    async def scenario(hub: MemoryHub) -> None:
        placed = await hub.place()
        await hub.submission()
        hub.world.broker.network = _Twice()  # every message arrives twice
        await hub.scheduler()
        assert (await hub.state(placed)).process_state is P.PROCESSED
        answers = [a["outcome"] for a in await hub.world.remote.attempts(order_id=placed.order_id)]
        assert answers == ["applied"] * 3, "one call a step: the inbox dropped every copy"

    run(scenario)


async def _runner(hub: MemoryHub) -> OrderRunner:
    """What a scheduler runs each claimed attempt with."""
    runtime = await hub.runtime("scheduler", "scheduler-late")
    router = ReplyRouter(runtime.senders("scheduler"))
    replies = PrivateQueue(
        runtime.connection, runtime.names.reply_queue("late"), router.deliver, max_bytes=65536
    )
    await replies.start()
    ctx = AttemptContext(
        store=runtime.store,
        publisher=runtime.publisher,
        names=runtime.names,
        router=router,
        reply_queue=replies.name,
        report=runtime.reporter(),
        rules=attempt_rules(runtime.settings),
    )
    return OrderRunner(ctx, Compensator(ctx))


class _Twice:
    def delay(self, queue: str, sender: str) -> float:
        return 0.0

    def duplicate(self, queue: str, sender: str) -> bool:
        return True


# -- what the simulation found: a message waiting for something else is never held, so no
# crash, and no broker restart, counts a delivery against it (seed 203491 of 16 orders, 12
# faults: an accepted order dead-lettered `redelivery-limit` after its submission process died
# five times while the message waited on the inbox claim the first one had left). Submission
# claims no inbox entry any more (decision:orders-deduped-by-order): the case is played on an
# agent's queue.


async def _dies_repeatedly(hub: MemoryHub, kind: str, times: int, every_s: float) -> None:
    """A process of `kind` that dies `times` times, `every_s` apart, and is started again
    (the simulation's process: a crash severs its connection, then cancels every task)."""
    process = hub.world.add(kind, f"{kind}-dying")
    for _ in range(times):
        process.start()
        await hub.sleep(every_s)
        process.crash()


def test_a_message_waiting_on_a_dead_consumers_claim_is_not_counted_by_crashes() -> None:
    async def scenario(hub: MemoryHub) -> None:
        await hub.place()
        await hub.submission()
        # The scheduler asks for the first step with no agent running: the request waits.
        await serve_scheduler(await hub.runtime("scheduler"), asyncio.Event(), burst=True)
        queue = hub.names.agent("inventory")
        request = hub.world.broker.delivered(hub.world.broker.queues[queue].ready[0])
        # An agent that died handling it left its inbox claim for the claim's time.
        key = f"{request.user_id}/{request.message_id}"
        until = utcnow() + timedelta(seconds=hub.settings.broker.inbox_claim_ttl_s)
        await hub.store.inbox_claim_many(
            queue, [InboxClaim(key, "dead-holder", until)], now=utcnow()
        )
        limit = hub.settings.broker.redelivery_limit
        await _dies_repeatedly(hub, "agent-inventory", limit + 1, every_s=3.0)
        queues = hub.world.broker.queues
        waiting = [m for n, q in queues.items() if n.startswith(queue) for m in q.ready]
        assert len(waiting) == 1 and not queues[f"{queue}.dlq"].ready, "dead-lettered"
        await hub.sleep(hub.settings.broker.inbox_claim_ttl_s)
        async with hub.agents():
            await hub.sleep(1.0)
        # Handled once the claim expired (its deadline had passed: no call), not dead-lettered.
        assert not queues[queue].ready
        assert not [n for n, q in queues.items() if n.startswith(queue) and q.ready], "parked"

    run(scenario)
