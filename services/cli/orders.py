"""`orderflow orders …`: find and inspect orders (list, show, history); the actions on them
(resubmit, compensate) are in `order_actions`. Every command prints a table for people and JSON
with `--json` for scripts.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from datetime import datetime, timedelta
from typing import Any

import click
from pydantic import TypeAdapter, ValidationError
from rich.table import Table
from rich.text import Text

from services.cli.explain import (
    add_columns,
    current_step,
    group_failures,
    human_age,
    human_duration,
    next_action,
    parse_duration,
    plain_console,
    step_rows,
    undo_plan,
)
from services.cli.render import short_token, shown
from services.cli.settings import pass_settings
from shared.config import Settings
from shared.domain.journal import HistoryEvent
from shared.domain.models import OrderId, StateRecord
from shared.domain.states import ErrorKind, ProcessState
from shared.domain.timing import utcnow
from shared.errors import BadInput
from shared.store.factory import open_store
from shared.store.port import ListCursor, StateQuery, StateStore

SCAN_CAP = 100_000
"""The most records one listing or bulk action reads; it says so when it stops there."""

_ORDER_ID: TypeAdapter[str] = TypeAdapter(OrderId)


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


def duration_seconds(value: str | None) -> float | None:
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


async def matching(
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
@pass_settings()
def list_cmd(
    settings: Settings,
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
    now = utcnow()
    age = duration_seconds(older_than)
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
            async for record in matching(store, query, step, cursor):
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
            shown(r.order_id),
            r.process_state.value,
            shown(current_step(r) or "-"),
            str(r.attempt),
            str(r.failure_count),
            shown(error),
            human_age(r.updated_at, now),
        )
    console = plain_console()
    console.print(table)
    if next_cursor:
        console.print(
            shown(f"more: orderflow orders list … --after '{next_cursor}'"), soft_wrap=True
        )


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
            shown(g.fingerprint[:80]),
            ", ".join(f"{n} {s}" for s, n in g.states.items()),
            human_age(g.newest, now),
            Text("\n").join(shown(order_id) for order_id in g.order_ids[:3]),
        )
    plain_console().print(table)


# -- show ---------------------------------------------------------------------------------------


@orders.command("show")
@click.argument("order_id")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@pass_settings()
def show_cmd(settings: Settings, order_id: str, as_json: bool) -> None:
    """An order: its data, state, steps, retry budget, lease, and what happens next."""
    check_ids((order_id,))

    async def fetch() -> dict[str, Any]:
        store = await open_store(settings)
        try:
            record = await store.get_state(order_id)
            order = await store.get_order(order_id)
            log = await store.read_compensation(order_id)
        finally:
            await store.close()
        if record is None and order is None:
            raise BadInput(f"no order {order_id} in hub {settings.hub}{_purged_note(settings)}")
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
    data["payment_token"] = short_token(str(data.get("payment_token", "")))  # never in full
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
    console.print(shown(f"order {result['order_id']}"))
    if order is not None:
        total = sum(line["quantity"] * line["unit_price_cents"] for line in order["lines"])
        console.print(
            shown(
                f"  customer {order['customer_id']}, {len(order['lines'])} line(s), "
                f"{total / 100:.2f} {order['currency']}, payment {order['payment_token']}, "
                f"ship to {order['shipping_address']['country']} "
                f"{order['shipping_address']['postal_code']}; received {result['received_at']}"
            )
        )
    if state is None:
        console.print("  no state record (the audit reports this)")
        return
    budget = state["retry_budget"]
    console.print(
        shown(
            f"  state {state['process_state']} ({state['workflow']}), "
            f"attempt {state['attempt']}, failures {state['failure_count']} of "
            f"{state['failure_threshold']}, retry budget {budget['used']}/{budget['limit']} used"
        )
    )
    if state["locked_by"]:
        deadline = datetime.fromisoformat(state["complete_by"]) if state["complete_by"] else None
        console.print(
            shown(
                f"  lease: {state['locked_by']} on {state['owner'] or '?'}, "
                f"deadline {human_age(deadline, now)}"
            )
        )
    if state["error"]:
        console.print(shown(f"  error: {state['error']['kind']}: {state['error']['message']}"))
    steps = Table(title="steps")
    add_columns(steps, "step", "status", "attempts", "took", "error")
    for s in state["steps"]:
        error = s["error"]
        steps.add_row(
            shown(s["step"]),
            s["status"],
            str(s["attempts"]),
            "-" if s["seconds"] is None else human_duration(s["seconds"]),
            shown("" if error is None else f"{error['kind']}: {error['message'][:70]}"),
        )
    console.print(steps)
    if result["compensation"]:
        undo = Table(title="undo log (newest first)")
        add_columns(undo, "step", "undo", "status", "idempotency key")
        for u in result["compensation"]:
            undo.add_row(
                shown(u["step"]), shown(u["undo"]), u["status"], shown(u["idempotency_key"])
            )
        console.print(undo)
    console.print(shown(f"next: {state['next']}"), soft_wrap=True)


# -- history ------------------------------------------------------------------------------------


@orders.command("history")
@click.argument("order_id")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@pass_settings()
def history_cmd(settings: Settings, order_id: str, as_json: bool) -> None:
    """The order's timeline in the task hub, with the time between events."""
    check_ids((order_id,))

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
        raise BadInput(
            f"no history for order {order_id} in hub {settings.hub}{_purged_note(settings)}"
        )
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
            shown(row["step"] or ""),
            shown(details[:90]),
        )
    plain_console().print(table)
    click.echo(f"{len(rows)} events over {human_duration(rows[-1]['since_start_s'])}")


def _purged_note(settings: Settings) -> str:
    """What an operator looking for a missing order should know: finished orders go."""
    kept = settings.order_retention_s
    span = f"{kept / 86_400:g} days" if kept >= 86_400 else f"{kept:g} s"
    return (
        f" (a finished order, Processed or Compensated, is deleted {span} after it "
        "finished: ORDERFLOW_ORDER_RETENTION_S)"
    )
