"""`orderflow orders …`: find, inspect and act on orders.

Every action is conditional on the order as the operator selected it (an order that changed
since, or that no longer matches the query that selected it, is refused, never overwritten) and
recorded in the order's history with who asked, by the same conditional write. Every command
prints a table for people and JSON with `--json` for scripts.
"""

from __future__ import annotations

import asyncio
import getpass
import json
import re
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import click
from pydantic import TypeAdapter, ValidationError
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from services.cli.explain import (
    add_columns,
    count_by,
    current_step,
    group_failures,
    human_age,
    human_duration,
    next_action,
    parse_duration,
    plain_console,
    step_rows,
    undo_plan,
    unselected_because,
)
from shared.config import Settings
from shared.domain.compensation import request_compensation, resubmit
from shared.domain.journal import HistoryEvent, HistoryEventType
from shared.domain.models import OrderId, StateRecord
from shared.domain.states import ErrorKind, ProcessState
from shared.domain.timing import utcnow
from shared.domain.updates import Update
from shared.domain.workflow import get_workflow
from shared.errors import IllegalTransition, OrderflowError
from shared.store.factory import open_store
from shared.store.port import ListCursor, StateQuery, StateStore

SCAN_CAP = 100_000
"""The most records one listing or bulk action reads; it says so when it stops there."""

_ORDER_ID: TypeAdapter[str] = TypeAdapter(OrderId)


class BadInput(OrderflowError):
    """The operator gave something that cannot be an answerable question."""


def _settings(ctx: click.Context) -> Settings:
    settings: Settings = ctx.find_object(Settings)  # type: ignore[assignment]
    return settings


def check_ids(order_ids: tuple[str, ...]) -> None:
    for order_id in order_ids:
        try:
            _ORDER_ID.validate_python(order_id)
        except ValidationError:
            raise BadInput(
                f"malformed order id {order_id!r}: 1-64 letters, digits, '.', '_' or '-'"
            ) from None


def _states(values: tuple[str, ...]) -> frozenset[ProcessState] | None:
    return frozenset(ProcessState(v) for v in values) if values else None


def _duration(value: str | None) -> float | None:
    if value is None:
        return None
    try:
        return parse_duration(value).total_seconds()
    except ValueError as exc:
        raise BadInput(str(exc)) from None


def _cursor(text: str | None) -> ListCursor | None:
    if text is None:
        return None
    at, sep, order_id = text.partition("|")
    try:
        if not sep:
            raise ValueError(text)
        return ListCursor(datetime.fromisoformat(at), order_id)
    except ValueError:
        raise BadInput(f"not a cursor from `orders list`: {text!r}") from None


def _cursor_text(record: StateRecord) -> str:
    return f"{record.updated_at.isoformat()}|{record.order_id}"


async def _matching(
    store: StateStore, query: StateQuery, step: str | None, after: ListCursor | None
) -> AsyncIterator[StateRecord]:
    """Records matching the query and the step, newest change first, up to SCAN_CAP read."""
    read = 0
    while read < SCAN_CAP:
        page = await store.query_states(query, limit=500, after=after)
        if not page:
            return
        read += len(page)
        for record in page:
            if step is None or current_step(record) == step:
                yield record
        after = ListCursor(page[-1].updated_at, page[-1].order_id)
    raise BadInput(f"more than {SCAN_CAP} records match: narrow the filter")


state_choice = click.Choice([s.value for s in ProcessState], case_sensitive=False)
kind_choice = click.Choice([k.value for k in ErrorKind], case_sensitive=False)


@click.group()
def orders() -> None:
    """Find, inspect and act on orders (actions are conditional and recorded in the history)."""


# -- list ---------------------------------------------------------------------------------------


@orders.command("list")
@click.option("--state", "states", multiple=True, type=state_choice, help="Repeatable.")
@click.option("--older-than", help="Last changed longer ago than this (90s, 15m, 2h, 1d).")
@click.option("--step", help="Orders whose current step (first not Completed) is this one.")
@click.option("--error-kind", type=kind_choice, help="Only orders whose error is of this kind.")
@click.option("--limit", default=50, show_default=True, type=click.IntRange(1, 10_000))
@click.option("--after", "after_text", help="Continue a listing: the cursor it printed.")
@click.option(
    "--group-by",
    type=click.Choice(["error"]),
    help="Group failed orders by error kind and message fingerprint instead of listing them.",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def list_cmd(
    ctx: click.Context,
    states: tuple[str, ...],
    older_than: str | None,
    step: str | None,
    error_kind: str | None,
    limit: int,
    after_text: str | None,
    group_by: str | None,
    as_json: bool,
) -> None:
    """Orders, most recently changed first; filter by state, age, step and error kind."""
    settings = _settings(ctx)
    now = utcnow()
    age = _duration(older_than)
    wanted = _states(states)
    if group_by and wanted is None:
        wanted = frozenset({ProcessState.ERROR, ProcessState.COMPENSATION_FAILED})
    query = StateQuery(
        states=wanted,
        changed_before=None if age is None else now - timedelta(seconds=age),
        error_kind=None if error_kind is None else ErrorKind(error_kind),
    )
    cursor = _cursor(after_text)

    async def fetch() -> list[StateRecord]:
        store = await open_store(settings)
        try:
            found: list[StateRecord] = []
            async for record in _matching(store, query, step, cursor):
                found.append(record)
                if not group_by and len(found) > limit:
                    break
            return found
        finally:
            await store.close()

    records = asyncio.run(fetch())
    if group_by:
        _print_groups(records, now, as_json=as_json)
        return
    more = len(records) > limit
    records = records[:limit]
    next_cursor = _cursor_text(records[-1]) if more and records else None
    if as_json:
        click.echo(
            json.dumps(
                {
                    "orders": [_summary(r, now) for r in records],
                    "next": next_cursor,
                }
            )
        )
        return
    table = Table(title=f"{len(records)} order(s), most recently changed first")
    add_columns(table, "order", "state", "step", "attempt", "failures", "error", "changed")
    for r in records:
        error = "" if r.error is None else f"{r.error.kind.value}: {r.error.message[:60]}"
        table.add_row(
            r.order_id,
            r.process_state.value,
            current_step(r) or "-",
            str(r.attempt),
            str(r.failure_count),
            error,
            human_age(r.updated_at, now),
        )
    console = plain_console()
    console.print(table)
    if next_cursor:
        console.print(f"more: orderflow orders list … --after '{next_cursor}'", soft_wrap=True)


def _summary(r: StateRecord, now: datetime) -> dict[str, Any]:
    return {
        "order_id": r.order_id,
        "state": r.process_state.value,
        "step": current_step(r),
        "attempt": r.attempt,
        "failures": r.failure_count,
        "error": None
        if r.error is None
        else {"kind": r.error.kind.value, "message": r.error.message},
        "updated_at": r.updated_at.isoformat(),
        "cursor": _cursor_text(r),
    }


def _print_groups(records: list[StateRecord], now: datetime, *, as_json: bool) -> None:
    groups = group_failures(records)
    if as_json:
        click.echo(json.dumps({"groups": [g.to_json() for g in groups]}))
        return
    table = Table(title=f"{sum(g.count for g in groups)} failed order(s) in {len(groups)} group(s)")
    add_columns(table, "count", "kind", "fingerprint", "states", "newest", "examples")
    for g in groups:
        table.add_row(
            str(g.count),
            g.kind,
            g.fingerprint[:80],
            ", ".join(f"{n} {s}" for s, n in g.states.items()),
            human_age(g.newest, now),
            "\n".join(g.order_ids[:3]),
        )
    plain_console().print(table)


# -- show ---------------------------------------------------------------------------------------


@orders.command("show")
@click.argument("order_id")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def show_cmd(ctx: click.Context, order_id: str, as_json: bool) -> None:
    """An order: its data, state, steps, retry budget, lease, and what happens next."""
    check_ids((order_id,))
    settings = _settings(ctx)

    async def fetch() -> dict[str, Any]:
        store = await open_store(settings)
        try:
            record = await store.get_state(order_id)
            order = await store.get_order(order_id)
            log = await store.read_compensation(order_id)
        finally:
            await store.close()
        if record is None and order is None:
            raise BadInput(f"no order {order_id} in hub {settings.hub}")
        now = utcnow()
        return {
            "order_id": order_id,
            "order": None if order is None else _order_json(order.data.model_dump(mode="json")),
            "received_at": None if order is None else order.received_at.isoformat(),
            "state": None if record is None else _state_json(record, settings, now),
            "compensation": [
                {
                    "step": u.step,
                    "undo": u.operation,
                    "idempotency_key": u.idempotency_key,
                    "status": u.status.value,
                }
                for u in undo_plan(log)
            ],
        }

    result = asyncio.run(fetch())
    if as_json:
        click.echo(json.dumps(result))
        return
    _print_show(result)


def _order_json(data: dict[str, Any]) -> dict[str, Any]:
    token = str(data.get("payment_token", ""))
    data["payment_token"] = token[:8] + "…" if len(token) > 8 else token  # never in full
    return data


def _state_json(r: StateRecord, settings: Settings, now: datetime) -> dict[str, Any]:
    return {
        "process_state": r.process_state.value,
        "workflow": f"{r.workflow} v{r.workflow_version}",
        "attempt": r.attempt,
        "locked_by": r.locked_by,
        "owner": r.owner,
        "complete_by": r.complete_by.isoformat() if r.complete_by else None,
        "next_attempt_at": r.next_attempt_at.isoformat(),
        "failure_count": r.failure_count,
        "failure_threshold": settings.failure_threshold,
        "retry_budget": {
            "limit": r.retry_budget.limit,
            "used": r.retry_budget.used,
            "remaining": r.retry_budget.remaining,
        },
        "reply_to": r.reply_to,
        "error": None
        if r.error is None
        else {"kind": r.error.kind.value, "message": r.error.message, "at": r.error.at.isoformat()},
        "created_at": r.created_at.isoformat(),
        "updated_at": r.updated_at.isoformat(),
        "steps": step_rows(r),
        "next": next_action(r, settings, now),
    }


def _print_show(result: dict[str, Any]) -> None:
    console = plain_console()
    now = utcnow()
    state = result["state"]
    order = result["order"]
    console.print(f"order {result['order_id']}")
    if order is not None:
        total = sum(line["quantity"] * line["unit_price_cents"] for line in order["lines"])
        console.print(
            f"  customer {order['customer_id']}, {len(order['lines'])} line(s), "
            f"{total / 100:.2f} {order['currency']}, payment {order['payment_token']}, "
            f"ship to {order['shipping_address']['country']} "
            f"{order['shipping_address']['postal_code']}; received {result['received_at']}"
        )
    if state is None:
        console.print("  no state record (the audit reports this)")
        return
    budget = state["retry_budget"]
    console.print(
        f"  state {state['process_state']} ({state['workflow']}), "
        f"attempt {state['attempt']}, failures {state['failure_count']} of "
        f"{state['failure_threshold']}, retry budget {budget['used']}/{budget['limit']} used"
    )
    if state["locked_by"]:
        deadline = datetime.fromisoformat(state["complete_by"]) if state["complete_by"] else None
        console.print(
            f"  lease: {state['locked_by']} on {state['owner'] or '?'}, "
            f"deadline {human_age(deadline, now)}"
        )
    if state["error"]:
        console.print(f"  error: {state['error']['kind']}: {state['error']['message']}")
    steps = Table(title="steps")
    add_columns(steps, "step", "status", "attempts", "took", "error")
    for s in state["steps"]:
        error = s["error"]
        steps.add_row(
            s["step"],
            s["status"],
            str(s["attempts"]),
            "-" if s["seconds"] is None else human_duration(s["seconds"]),
            "" if error is None else f"{error['kind']}: {error['message'][:70]}",
        )
    console.print(steps)
    if result["compensation"]:
        undo = Table(title="undo log (newest first)")
        add_columns(undo, "step", "undo", "status", "idempotency key")
        for u in result["compensation"]:
            undo.add_row(u["step"], u["undo"], u["status"], u["idempotency_key"])
        console.print(undo)
    console.print(f"next: {state['next']}", soft_wrap=True)


# -- history ------------------------------------------------------------------------------------


@orders.command("history")
@click.argument("order_id")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def history_cmd(ctx: click.Context, order_id: str, as_json: bool) -> None:
    """The order's timeline in the task hub, with the time between events."""
    check_ids((order_id,))
    settings = _settings(ctx)

    async def fetch() -> tuple[list[HistoryEvent], StateRecord | None]:
        store = await open_store(settings)
        try:
            return await store.read_history(order_id), await store.get_state(order_id)
        finally:
            await store.close()

    events, state = asyncio.run(fetch())
    if not events:
        if state is not None and state.process_state.is_terminal:
            raise BadInput(
                f"order {order_id} finished ({state.process_state.value} at "
                f"{state.updated_at.isoformat()}); its history has expired "
                f"(retention {settings.retention_s:g} s)"
            )
        raise BadInput(f"no history for order {order_id} in hub {settings.hub}")
    start = events[0].at
    rows: list[dict[str, Any]] = []
    previous = start
    for e in events:
        rows.append(
            {
                "at": e.at.isoformat(),
                "since_start_s": (e.at - start).total_seconds(),
                "since_previous_s": (e.at - previous).total_seconds(),
                "event": e.type.value,
                "attempt": e.attempt,
                "instance_id": e.instance_id,
                "step": e.step,
                "data": e.data,
            }
        )
        previous = e.at
    if as_json:
        click.echo(json.dumps({"order_id": order_id, "events": rows}))
        return
    table = Table(title=f"history of {order_id}")
    add_columns(table, "at", "+", "event", "attempt", "step", "details")
    for row in rows:
        details = " ".join(f"{k}={v}" for k, v in row["data"].items())
        table.add_row(
            row["at"][11:23],
            human_duration(row["since_previous_s"]),
            row["event"],
            "" if row["attempt"] is None else str(row["attempt"]),
            row["step"] or "",
            details[:90],
        )
    plain_console().print(table)
    click.echo(f"{len(rows)} events over {human_duration(rows[-1]['since_start_s'])}")


# -- actions ------------------------------------------------------------------------------------


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
    age = _duration(older_than)
    return StateQuery(
        states=frozenset({ProcessState(state)}),
        changed_before=None if age is None else now - timedelta(seconds=age),
        error_kind=None if error_kind is None else ErrorKind(error_kind),
    )


async def select(store: StateStore, query: StateQuery, step: str | None) -> Selection:
    """The orders the query (and step) select now, each with its last change as seen."""
    found = [(r.order_id, r.updated_at) async for r in _matching(store, query, step, None)]
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
            click.echo(f"{order_id}: {outcome}")
        verb = "would be changed" if dry_run else "changed"
        click.echo(f"{len(done)} {verb}, {len(refused)} refused")
        for reason, n in count_by([_reason(r) for _, r in refused]).items():
            click.echo(f"  {n} x {reason}")
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
@click.pass_context
def resubmit_cmd(
    ctx: click.Context,
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
    settings = _settings(ctx)
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
@click.pass_context
def compensate_cmd(
    ctx: click.Context, order_ids: tuple[str, ...], dry_run: bool, as_json: bool, by: str
) -> None:
    """Undo the completed steps of orders in Error or CompensationFailed, newest first.

    Prints the undo plan (steps, order, idempotency keys) first; undos already done are
    skipped, and each undo's idempotency key makes a repeat harmless. The change and its
    history event are one conditional write."""
    settings = _settings(ctx)
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
                click.echo(f"  {n}. {s['undo']} for {s['step']}, key {s['idempotency_key']}{mark}")

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
