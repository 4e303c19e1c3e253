"""The operator's actions on orders: resubmit (by id, or in bulk by query) and compensate.

Every action is conditional on the order as it was selected (an order that changed since, or
that no longer matches the query that selected it, is refused, never overwritten) and recorded
in the order's history, with who asked, by the same conditional write. A bulk action is paced
(`rate` per second at most), so that a just-recovered remote service is not flooded; a dry run
says what each order would become and changes nothing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from services.operator.explain import current_step, unselected_because
from services.operator.explain import fingerprint as fingerprint_of
from services.operator.views import matching
from shared.domain.journal import HistoryEvent, HistoryEventType
from shared.domain.models import StateRecord
from shared.domain.operator_actions import request_compensation, resubmit
from shared.domain.timing import utcnow
from shared.domain.updates import Update
from shared.domain.workflow import get_workflow
from shared.errors import IllegalTransition
from shared.store.port import StateQuery, StateStore

REFUSED = "refused"
"""How every refusal's outcome starts."""

Outcome = tuple[str, str]
"""(order id, what became of it: `Error -> Pending`, `would go …`, `refused: why`)."""
Progress = Callable[[int, int], None]
"""Told (orders done, orders selected) before the first and after each."""


@dataclass(frozen=True)
class Selection:
    """The orders an action is for, as the operator selected them."""

    orders: Sequence[tuple[str, datetime | None]]
    """(order_id, its `updated_at` when the query selected it); None for an order named by id,
    which the action takes as it finds it."""
    query: StateQuery | None = None
    step: str | None = None


Chooser = Callable[[StateStore], Awaitable[Selection]]
"""Selects the orders an action is for (named, or by query), once, before acting."""


@dataclass(frozen=True)
class Action:
    """An operator's action: the conditional update of one record and what its history says."""

    event: HistoryEventType
    plan: Callable[[StateRecord, datetime, datetime], Update]
    """(record, the `updated_at` the update must find, now) -> the update."""
    details: Callable[[StateRecord], dict[str, Any]] = lambda _record: {}
    """What the history event records besides who asked and the state it left."""


def resubmit_action(from_step: str | None, *, keep_failures: bool) -> Action:
    def plan(record: StateRecord, seen: datetime, now: datetime) -> Update:
        workflow = get_workflow(record.workflow, record.workflow_version)
        if workflow is None:
            raise ValueError(f"unknown workflow {record.workflow} v{record.workflow_version}")
        return resubmit(
            record,
            workflow,
            now=now,
            from_step=from_step,
            reset_failures=not keep_failures,
            seen_updated_at=seen,
        )

    def details(record: StateRecord) -> dict[str, Any]:
        return {"from_step": from_step or current_step(record), "reset_failures": not keep_failures}

    return Action(HistoryEventType.RESUBMITTED, plan, details)


COMPENSATE = Action(
    HistoryEventType.COMPENSATION_STARTED,
    lambda record, seen, now: request_compensation(record, now=now, seen_updated_at=seen),
)


async def select(
    store: StateStore, query: StateQuery, step: str | None, fingerprint: str | None = None
) -> Selection:
    """The orders the query (and step, and the fingerprint of their error: one failure group)
    select now, each with its last change as seen."""
    found = [
        (r.order_id, r.updated_at)
        async for r in matching(store, query, step, None)
        if fingerprint is None
        or (r.error is not None and fingerprint_of(r.error.message) == fingerprint)
    ]
    return Selection(found, query, step)


def named(order_ids: Sequence[str]) -> Chooser:
    """The orders by id, each taken as the action finds it."""

    async def choose(store: StateStore) -> Selection:
        return Selection([(order_id, None) for order_id in order_ids])

    return choose


def queried(query: StateQuery, step: str | None, fingerprint: str | None = None) -> Chooser:
    """The orders the query selects when the action starts."""

    async def choose(store: StateStore) -> Selection:
        return await select(store, query, step, fingerprint)

    return choose


async def act(
    store: StateStore,
    selection: Selection,
    action: Action,
    by: str,
    *,
    dry_run: bool,
    rate: float | None,
    progress: Progress | None = None,
) -> list[Outcome]:
    """Apply the action to each selected order conditionally, at most `rate` per second;
    (order, outcome) for each."""
    outcomes: list[Outcome] = []
    loop = asyncio.get_running_loop()
    started = loop.time()
    total = len(selection.orders)
    if progress is not None:
        progress(0, total)
    for n, (order_id, seen) in enumerate(selection.orders):
        if rate and not dry_run:
            # Pace the actions so a just-recovered remote service is not flooded.
            delay = started + n / rate - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
        outcome = await _act_one(store, order_id, seen, selection, action, by, dry_run)
        outcomes.append((order_id, outcome))
        if progress is not None:
            progress(n + 1, total)
    return outcomes


async def _act_one(
    store: StateStore,
    order_id: str,
    seen: datetime | None,
    selection: Selection,
    action: Action,
    by: str,
    dry_run: bool,
) -> str:
    record = await store.get_state(order_id)
    if record is None:
        return f"{REFUSED}: no such order"
    if seen is not None and (stale := _changed_since_selected(record, seen, selection)):
        return f"{REFUSED}: changed since it was selected (now {record.process_state}){stale}"
    now = utcnow()
    try:
        update = action.plan(record, record.updated_at if seen is None else seen, now)
    except (IllegalTransition, ValueError) as exc:
        return f"{REFUSED}: {exc}"
    target = update.changes.fields.get("process_state", record.process_state)
    if dry_run:
        return f"would go {record.process_state} -> {target}"
    event = HistoryEvent(
        order_id=order_id,
        type=action.event,
        at=now,
        attempt=record.attempt,
        data={"by": by, "from": record.process_state.value, **action.details(record)},
    )
    # The event is written by the same conditional write: both or neither.
    after = await store.update_state(order_id, update.expect, update.changes, history=[event])
    if after is None:
        if seen is not None:
            return f"{REFUSED}: changed since it was selected; select it again"
        return f"{REFUSED}: the order changed meanwhile; look again"
    return f"{record.process_state} -> {after.process_state}"


def _changed_since_selected(record: StateRecord, seen: datetime, selection: Selection) -> str:
    """Why a record selected by query must not be acted on now ('' if it may): it no longer
    matches the query, or it changed at all since (the conditional write expects `seen`)."""
    if selection.query is not None:
        why = unselected_because(record, selection.query, selection.step)
        if why is not None:
            return f": {why}"
    return "" if record.updated_at == seen else "; select it again"


def refused(outcome: str) -> bool:
    return outcome.startswith(REFUSED)
