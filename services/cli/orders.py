"""`orderflow orders …`: find and inspect orders (list, show, history); the actions on them
(resubmit, compensate) are in `order_actions`. Every command prints a table for people and JSON
with `--json` for scripts; the views themselves are `services/operator/views.py`.
"""

from __future__ import annotations

from datetime import datetime, timedelta

import click
from pydantic import TypeAdapter, ValidationError
from rich.table import Table
from rich.text import Text

from services.cli.operations import run_operations
from services.cli.render import add_columns, echo_json, in_words, plain_console, shown
from services.cli.settings import pass_settings
from services.operator.explain import FailureGroup, current_step
from services.operator.results import FailureGroups, OrderList, OrderView, StepRow, UndoRow
from services.operator.views import order_summary, parse_cursor, state_query
from shared.config import Settings
from shared.domain.durations import human_age, human_duration, parse_duration
from shared.domain.models import OrderId
from shared.domain.states import FAILED_STATES, ErrorKind, ProcessState
from shared.domain.timing import utcnow
from shared.errors import BadInput

_ORDER_ID: TypeAdapter[str] = TypeAdapter(OrderId)


def check_ids(order_ids: tuple[str, ...]) -> None:
    for order_id in order_ids:
        try:
            _ORDER_ID.validate_python(order_id)
        except ValidationError:
            raise BadInput(
                f"malformed order id {order_id!r}: 1-64 letters, digits, '.', '_' or '-'"
            ) from None


def states_of(values: tuple[str, ...]) -> frozenset[ProcessState] | None:
    return frozenset(ProcessState(v) for v in values) if values else None


def kind_of(value: str | None) -> ErrorKind | None:
    return None if value is None else ErrorKind(value)


def duration_of(value: str | None) -> timedelta | None:
    if value is None:
        return None
    try:
        return parse_duration(value)
    except ValueError as exc:
        raise BadInput(str(exc)) from None


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
@click.option(
    "--limit",
    default=50,
    show_default=True,
    type=click.IntRange(1, 10_000),
    help="Most orders on a page (`--after` continues with the next).",
)
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
    age = duration_of(older_than)
    wanted = states_of(states)
    if group_by and wanted is None:
        wanted = FAILED_STATES
    query = state_query(wanted, kind_of(error_kind), age, now=now)
    cursor = parse_cursor(after_text)
    if group_by:
        groups = run_operations(settings, lambda ops: ops.failures(query, step, cursor))
        _print_groups(groups, now, as_json=as_json)
        return
    page = run_operations(settings, lambda ops: ops.orders(query, step, cursor, limit))
    if as_json:
        listed = OrderList(orders=[order_summary(r, now) for r in page.records], next=page.next)
        echo_json(listed.model_dump(mode="json"))
        return
    table = Table(title=f"{len(page.records)} order(s), most recently changed first")
    add_columns(table, "order", "state", "step", "attempt", "failures", "error", "changed")
    for r in page.records:
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
    if page.next:
        console.print(shown(f"more: orderflow orders list … --after '{page.next}'"), soft_wrap=True)


def _print_groups(groups: list[FailureGroup], now: datetime, *, as_json: bool) -> None:
    if as_json:
        echo_json(FailureGroups(groups=[g.view() for g in groups]).model_dump(mode="json"))
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
    result = run_operations(settings, lambda ops: ops.order(order_id))
    if as_json:
        echo_json(result.model_dump(mode="json"))
        return
    _print_show(result)


def _print_show(result: OrderView) -> None:
    console = plain_console()
    now = utcnow()
    state = result.state
    order = result.order
    console.print(shown(f"order {result.order_id}"))
    if order is not None:
        total = sum(line["quantity"] * line["unit_price_cents"] for line in order["lines"])
        console.print(
            shown(
                f"  customer {order['customer_id']}, {len(order['lines'])} line(s), "
                f"{total / 100:.2f} {order['currency']}, payment {order['payment_token']}, "
                f"ship to {order['shipping_address']['country']} "
                f"{order['shipping_address']['postal_code']}; received {result.received_at}"
            )
        )
    if state is None:
        console.print("  no state record (the audit reports this)")
        return
    budget = state.retry_budget
    console.print(
        shown(
            f"  state {state.process_state} ({state.workflow}), "
            f"attempt {state.attempt}, failures {state.failure_count} of "
            f"{state.failure_threshold}, retry budget {budget.used}/{budget.limit} used"
        )
    )
    if state.locked_by:
        deadline = datetime.fromisoformat(state.complete_by) if state.complete_by else None
        console.print(
            shown(
                f"  lease: {state.locked_by} on {state.owner or '?'}, "
                f"deadline {human_age(deadline, now)}"
            )
        )
    if state.error:
        console.print(shown(f"  error: {state.error.kind}: {state.error.message}"))
    console.print(_steps_table(state.steps))
    if result.compensation:
        console.print(_undo_table(result.compensation))
    console.print(shown(f"next: {state.next}"), soft_wrap=True)


def _steps_table(steps: list[StepRow]) -> Table:
    table = Table(title="steps")
    add_columns(table, "step", "status", "attempts", "took", "error")
    for s in steps:
        error = s.error
        table.add_row(
            shown(s.step),
            s.status,
            str(s.attempts),
            "-" if s.seconds is None else human_duration(s.seconds),
            shown("" if error is None else f"{error.kind}: {error.message[:70]}"),
        )
    return table


def _undo_table(undos: list[UndoRow]) -> Table:
    table = Table(title="undo log (newest first)")
    add_columns(table, "step", "undo", "status", "idempotency key")
    for u in undos:
        table.add_row(shown(u.step), shown(u.undo), u.status, shown(u.idempotency_key))
    return table


# -- history ------------------------------------------------------------------------------------


@orders.command("history")
@click.argument("order_id")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@pass_settings()
def history_cmd(settings: Settings, order_id: str, as_json: bool) -> None:
    """The order's timeline in the task hub, with the time between events."""
    check_ids((order_id,))
    rows = run_operations(settings, lambda ops: ops.timeline(order_id))
    if as_json:
        echo_json({"order_id": order_id, "events": [r.model_dump(mode="json") for r in rows]})
        return
    table = Table(title=f"history of {order_id}")
    add_columns(table, "at", "+", "event", "attempt", "step", "details")
    for row in rows:
        details = " ".join(f"{k}={in_words(v)}" for k, v in row.data.items())
        table.add_row(
            row.at[11:23],
            human_duration(row.since_previous_s),
            row.event,
            "" if row.attempt is None else str(row.attempt),
            shown(row.step or ""),
            shown(details[:90]),
        )
    plain_console().print(table)
    click.echo(f"{len(rows)} events over {human_duration(rows[-1].since_start_s)}")
