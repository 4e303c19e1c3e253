"""The PostgreSQL store's claim hook: where the scheduler's `claim-uncommitted` crash drill dies.

The adapter has no fault code of its own; the store factory gives it the drill as a hook that it
calls inside the claim's transaction, after the claim's UPDATE and before its COMMIT. A hook that
never returns (the drill exits the process there) leaves nothing claimed.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from datetime import timedelta

import pytest

from shared import crash
from shared.bootstrap import claim_drill
from shared.config import DrillSettings
from shared.domain.states import ProcessState
from shared.domain.timing import utcnow
from shared.domain.transitions import Action
from shared.store.postgres import BeforeClaimCommit, PostgresStore
from tests.conftest import POSTGRES_URL, service_missing
from tests.support.factories import order_pair


class _Died(Exception):
    """Stands for the drill's exit: the claim's transaction never commits."""


@pytest.fixture
async def open_with(hub: str) -> AsyncIterator[Callable[..., object]]:
    stores: list[PostgresStore] = []

    async def open_store(hook: BeforeClaimCommit | None) -> PostgresStore:
        try:
            store = await PostgresStore.connect(
                POSTGRES_URL, hub, pool_size=2, timeout=5, command_timeout=10,
                before_claim_commit=hook,
            )  # fmt: skip
        except Exception as exc:
            service_missing("PostgreSQL", exc)
        stores.append(store)
        await store.init()
        return store

    yield open_store
    await stores[0].drop()
    for store in stores:
        await store.close()


@pytest.mark.postgres
async def test_the_hook_runs_inside_the_claim_before_its_commit(open_with) -> None:
    seen: list[tuple[Action, int]] = []

    def dies(action: Action, claimed: int) -> None:
        seen.append((action, claimed))
        if action is Action.CLAIM:
            raise _Died

    store = await open_with(dies)
    for order_id in ("o-1", "o-2"):
        await store.insert_order(*order_pair(order_id))
    now = utcnow()
    claim = {"now": now, "limit": 10, "owner": "s", "complete_by": now + timedelta(seconds=30)}
    with pytest.raises(_Died):
        await store.claim(**claim)
    assert seen == [(Action.CLAIM, 2)]
    for order_id in ("o-1", "o-2"):  # the claim died with its transaction
        state = await store.get_state(order_id)
        assert state is not None
        assert (state.process_state, state.locked_by, state.attempt) == (
            ProcessState.PENDING,
            None,
            0,
        )
    # A compensator's claim passes the hook by (the drill counts only the scheduler's claims).
    assert await store.claim(**claim, compensating=True) == []
    assert seen[-1] == (Action.CLAIM_COMPENSATION, 0)
    # Without a hook, the same claim is one autocommitted statement.
    plain = await open_with(None)
    assert sorted(r.order_id for r in await plain.claim(**claim)) == ["o-1", "o-2"]


def test_the_factory_gives_the_drill_only_for_claim_uncommitted() -> None:
    assert claim_drill(DrillSettings(fault_crash_at="claim-uncommitted")) is crash.claim_uncommitted
    for point in (None, "after-claim", "after-request", "after-undo-request"):
        assert claim_drill(DrillSettings(fault_crash_at=point)) is None


def test_the_drill_counts_the_scheduler_s_claims_only(monkeypatch: pytest.MonkeyPatch) -> None:
    reached: list[tuple[str, int]] = []
    monkeypatch.setattr(crash, "crash_point", lambda point, times=1: reached.append((point, times)))
    crash.claim_uncommitted(Action.CLAIM_COMPENSATION, 3)
    crash.claim_uncommitted(Action.CLAIM, 2)
    assert reached == [("claim-uncommitted", 2)]
