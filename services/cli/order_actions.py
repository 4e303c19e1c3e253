"""`orderflow orders resubmit|compensate`: act on orders, as the operator selected them.

Every action is conditional on the order as it was selected (an order that changed since, or
that no longer matches the query that selected it, is refused, never overwritten) and recorded
in the order's history, with who asked, by the same conditional write.
"""

from __future__ import annotations

import asyncio
import getpass
import json
import re
import sys
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import click
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from services.cli.explain import (
    count_by,
    current_step,
    plain_console,
    undo_plan,
    unselected_because,
)
from services.cli.orders import (
    check_ids,
    duration_seconds,
    kind_choice,
    matching,
    orders,
)
from services.cli.render import plain
from services.cli.settings import pass_settings
from shared.domain.operator_actions import request_compensation, resubmit
from shared.errors import BadInput

__all__ = ["orders"]  # the `orders` group, with these commands registered on it
from shared.config import Settings
from shared.domain.journal import HistoryEvent, HistoryEventType
from shared.domain.models import StateRecord
from shared.domain.states import ErrorKind, ProcessState
from shared.domain.timing import utcnow
from shared.domain.updates import Update
from shared.domain.workflow import get_workflow
from shared.errors import IllegalTransition
from shared.store.factory import open_store
from shared.store.port import StateQuery, StateStore

by_option = click.option(
    "--by",
    default=getpass.getuser,
    show_default="your user name",
    help="Who asked, for the history.",
)


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


def selection_query(
    state: str, error_kind: str | None, older_than: str | None, *, now: datetime
) -> StateQuery:
    age = duration_seconds(older_than)
    return StateQuery(
        states=frozenset({ProcessState(state)}),
        changed_before=None if age is None else now - timedelta(seconds=age),
        error_kind=None if error_kind is None else ErrorKind(error_kind),
    )


async def select(store: StateStore, query: StateQuery, step: str | None) -> Selection:
    """The orders the query (and step) select now, each with its last change as seen."""
    found = [(r.order_id, r.updated_at) async for r in matching(store, query, step, None)]
    return Selection(found, query, step)


async def act(
    store: StateStore,
    selection: Selection,
    action: Action,
    by: str,
    *,
    dry_run: bool,
    rate: float | None,
    progress: Progress | None = None,
) -> list[tuple[str, str]]:
    """Apply the action to each selected order conditionally, at most `rate` per second;
    (order, outcome) for each."""
    outcomes: list[tuple[str, str]] = []
    loop = asyncio.get_running_loop()
    started = loop.time()
    task = progress.add_task("orders", total=len(selection.orders)) if progress else None
    for n, (order_id, seen) in enumerate(selection.orders):
        if rate and not dry_run:
            # Pace the actions so a just-recovered remote service is not flooded.
            delay = started + n / rate - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
        outcome = await _act_one(store, order_id, seen, selection, action, by, dry_run)
        outcomes.append((order_id, outcome))
        if progress is not None and task is not None:
            progress.advance(task)
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
        return "refused: no such order"
    if seen is not None and (stale := _changed_since_selected(record, seen, selection)):
        return f"refused: changed since it was selected (now {record.process_state}){stale}"
    now = utcnow()
    try:
        update = action.plan(record, record.updated_at if seen is None else seen, now)
    except (IllegalTransition, ValueError) as exc:
        return f"refused: {exc}"
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
            return "refused: changed since it was selected; select it again"
        return "refused: the order changed meanwhile; look again"
    return f"{record.process_state} -> {after.process_state}"


def _changed_since_selected(record: StateRecord, seen: datetime, selection: Selection) -> str:
    """Why a record selected by query must not be acted on now ('' if it may): it no longer
    matches the query, or it changed at all since (the conditional write expects `seen`)."""
    if selection.query is not None:
        why = unselected_because(record, selection.query, selection.step)
        if why is not None:
            return f": {why}"
    return "" if record.updated_at == seen else "; select it again"


def _reason(outcome: str) -> str:
    """A refusal without its order-specific details, to count refusals by cause."""
    return re.sub(r"\b(?:ord|o)-[A-Za-z0-9._-]+", "#", outcome)


def report(outcomes: list[tuple[str, str]], *, as_json: bool, dry_run: bool) -> None:
    """What changed and what was refused and why; exit 1 if any was refused."""
    done = [(o, r) for o, r in outcomes if not r.startswith("refused")]
    refused = [(o, r) for o, r in outcomes if r.startswith("refused")]
    if as_json:
        click.echo(
            json.dumps(
                {
                    "dry_run": dry_run,
                    "done": [{"order_id": o, "outcome": r} for o, r in done],
                    "refused": [{"order_id": o, "reason": r} for o, r in refused],
                }
            )
        )
    else:
        for order_id, outcome in outcomes if len(outcomes) <= 50 else refused[:50]:
            click.echo(plain(f"{order_id}: {outcome}"))
        verb = "would be changed" if dry_run else "changed"
        click.echo(f"{len(done)} {verb}, {len(refused)} refused")
        for reason, n in count_by([_reason(r) for _, r in refused]).items():
            click.echo(plain(f"  {n} x {reason}"))
    if refused:
        sys.exit(1)


def _run_actions(
    settings: Settings,
    choose: Chooser,
    action: Action,
    by: str,
    *,
    dry_run: bool,
    rate: float | None,
    as_json: bool,
    bar: bool,
) -> list[tuple[str, str]]:
    """Select the orders, then act on them as selected, with a progress bar on a terminal."""

    async def run(progress: Progress | None) -> list[tuple[str, str]]:
        store = await open_store(settings)
        try:
            selection = await choose(store)
            return await act(
                store, selection, action, by, dry_run=dry_run, rate=rate, progress=progress
            )
        finally:
            await store.close()

    if as_json or not bar or not sys.stderr.isatty():
        return asyncio.run(run(None))
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn())
    with Progress(*columns, TimeElapsedColumn(), console=plain_console(stderr=True)) as progress:
        return asyncio.run(run(progress))


def _named(order_ids: tuple[str, ...]) -> Chooser:
    async def choose(store: StateStore) -> Selection:
        return Selection([(order_id, None) for order_id in order_ids])

    return choose


def _queried(query: StateQuery, step: str | None) -> Chooser:
    async def choose(store: StateStore) -> Selection:
        return await select(store, query, step)

    return choose


@orders.command("resubmit")
@click.argument("order_ids", nargs=-1)
@click.option(
    "--state",
    type=click.Choice([ProcessState.ERROR.value], case_sensitive=False),
    help="Select every order in this state (only Error can be resubmitted).",
)
@click.option("--error-kind", type=kind_choice, help="With --state: only this error kind.")
@click.option("--older-than", help="With --state: last changed longer ago (90s, 15m, 2h, 1d).")
@click.option("--step", help="With --state: only orders stopped at this step.")
@click.option("--from-step", help="Start over from this step (default: the first not Completed).")
@click.option("--keep-failures", is_flag=True, help="Keep the failure count (default: reset it).")
@click.option(
    "--rate",
    type=click.FloatRange(min=0.1),
    default=20.0,
    show_default=True,
    help="Resubmissions per second at most.",
)
@click.option("--dry-run", is_flag=True, help="Say what would change; change nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@by_option
@pass_settings()
def resubmit_cmd(
    settings: Settings,
    order_ids: tuple[str, ...],
    state: str | None,
    error_kind: str | None,
    older_than: str | None,
    step: str | None,
    from_step: str | None,
    keep_failures: bool,
    rate: float,
    dry_run: bool,
    as_json: bool,
    by: str,
) -> None:
    """Send orders in Error back to Pending with a fresh retry budget: by id, or by query.

    Each order is changed only if it is still as it was selected: an order selected by query
    that changed since, or no longer matches the query, is refused (run the command again).
    The change and its history event are one conditional write."""
    check_ids(order_ids)
    if order_ids and (state or error_kind or older_than or step):
        raise BadInput("name orders or select them with --state/--error-kind/…, not both")
    if not order_ids and state is None:
        raise BadInput("name the orders, or select them with --state")
    choose = (
        _named(order_ids)
        if state is None
        else _queried(selection_query(state, error_kind, older_than, now=utcnow()), step)
    )
    outcomes = _run_actions(
        settings,
        choose,
        resubmit_action(from_step, keep_failures=keep_failures),
        by,
        dry_run=dry_run,
        rate=rate,
        as_json=as_json,
        bar=len(order_ids) != 1,
    )
    report(outcomes, as_json=as_json, dry_run=dry_run)


@orders.command("compensate")
@click.argument("order_ids", nargs=-1, required=True)
@click.option("--dry-run", is_flag=True, help="Print the undo plan; change nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@by_option
@pass_settings()
def compensate_cmd(
    settings: Settings, order_ids: tuple[str, ...], dry_run: bool, as_json: bool, by: str
) -> None:
    """Undo the completed steps of orders in Error or CompensationFailed, newest first.

    Prints the undo plan (steps, order, idempotency keys) first; undos already done are
    skipped, and each undo's idempotency key makes a repeat harmless. The change and its
    history event are one conditional write."""
    check_ids(order_ids)

    async def plans() -> dict[str, list[dict[str, Any]]]:
        store = await open_store(settings)
        try:
            return {
                order_id: [
                    {
                        "step": u.step,
                        "undo": u.operation,
                        "idempotency_key": u.idempotency_key,
                        "status": u.status.value,
                        "will_run": u.will_run,
                    }
                    for u in undo_plan(await store.read_compensation(order_id))
                ]
                for order_id in order_ids
            }
        finally:
            await store.close()

    undo = asyncio.run(plans())
    if not as_json:
        for order_id, steps in undo.items():
            click.echo(f"{order_id}: undo plan" + ("" if steps else ": nothing to undo"))
            for n, s in enumerate(steps, 1):
                mark = "" if s["will_run"] else "  (done already: skipped)"
                click.echo(
                    plain(f"  {n}. {s['undo']} for {s['step']}, key {s['idempotency_key']}{mark}")
                )

    outcomes = _run_actions(
        settings,
        _named(order_ids),
        COMPENSATE,
        by,
        dry_run=dry_run,
        rate=None,
        as_json=as_json,
        bar=len(order_ids) > 1,
    )
    if as_json:
        done = [{"order_id": o, "outcome": r, "plan": undo[o]} for o, r in outcomes]
        click.echo(json.dumps({"dry_run": dry_run, "orders": done}))
        if any(r.startswith("refused") for _, r in outcomes):
            sys.exit(1)
        return
    report(outcomes, as_json=False, dry_run=dry_run)
