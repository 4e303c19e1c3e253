"""When a scheduler claims new orders: at once after a quiet spell (the arrival watch wakes it),
and under a steady stream the arrivals of the claim gap together
(decision:new-order-claimed-on-arrival, decision:claim-gap-50-ms). A real
scheduler and agents on the memory adapters under virtual time (tests/support/memory_hub.py)."""

from __future__ import annotations

import asyncio
from typing import Any

from services.scheduler.service import CLAIM_GAP_S, serve_scheduler
from shared.domain.states import ProcessState
from tests.support.factories import order_pair
from tests.support.memory_hub import MemoryHub, run


class _Claims:
    """Every claim of new orders the store answers: (virtual time, order ids taken)."""

    def __init__(self, hub: MemoryHub) -> None:
        self.seen: list[tuple[float, list[str]]] = []
        real = hub.store.claim

        async def claim(*args: Any, **kwargs: Any) -> Any:
            taken = await real(*args, **kwargs)
            if taken and not kwargs.get("compensating"):
                self.seen.append((asyncio.get_running_loop().time(), [r.order_id for r in taken]))
            return taken

        hub.store.claim = claim  # type: ignore[method-assign]

    def of(self, order_id: str) -> tuple[float, list[str]]:
        return next(c for c in self.seen if order_id in c[1])


def test_an_order_after_a_quiet_spell_is_claimed_at_once_and_a_stream_by_the_gap() -> None:
    async def scenario(hub: MemoryHub) -> None:
        claims = _Claims(hub)
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        async with hub.agents():
            runtime = await hub.runtime("scheduler", "scheduler-1")
            scheduler = asyncio.create_task(serve_scheduler(runtime, stop))
            await hub.sleep(1.0)  # ready, watching, nothing to do

            arrived = loop.time()
            await hub.store.insert_order(*order_pair("o-first"))
            # The rest of a stream, 10 ms apart: within the gap after the first claim.
            for n in range(1, 4):
                await hub.sleep(0.01)
                await hub.store.insert_order(*order_pair(f"o-next-{n}"))
            await hub.sleep(2.0)

            first_at, first = claims.of("o-first")
            assert first == ["o-first"]
            assert first_at - arrived < 0.005, "claimed at the arrival, not at the next poll"
            later_at, later = claims.of("o-next-1")
            assert sorted(later) == ["o-next-1", "o-next-2", "o-next-3"], claims.seen
            assert later_at - first_at >= CLAIM_GAP_S - 1e-6
            assert later_at - first_at < hub.settings.scheduler.poll_interval_s

            for order_id in ("o-first", "o-next-1", "o-next-2", "o-next-3"):
                state = await hub.store.get_state(order_id)
                assert state is not None and state.process_state is ProcessState.PROCESSED
            stop.set()
            await scheduler

    run(scenario)
