"""`orderflow orders resubmit|compensate`: the operator's conditional actions on orders."""

from __future__ import annotations

import asyncio
import getpass
import sys
from collections.abc import Callable

import click

from shared.config import Settings
from shared.domain.compensation import request_compensation, resubmit
from shared.domain.journal import HistoryEvent, HistoryEventType
from shared.domain.models import StateRecord
from shared.domain.timing import utcnow
from shared.domain.updates import Update
from shared.domain.workflow import get_workflow
from shared.errors import IllegalTransition
from shared.store.factory import open_store

Plan = Callable[[StateRecord], Update]


async def _act(
    settings: Settings, order_ids: tuple[str, ...], plan: Plan, event: HistoryEventType, by: str
) -> list[tuple[str, str]]:
    """Apply `plan` to each order conditionally; (order id, outcome) for each."""
    store = await open_store(settings)
    outcomes: list[tuple[str, str]] = []
    try:
        for order_id in order_ids:
            record = await store.get_state(order_id)
            if record is None:
                outcomes.append((order_id, "refused: no such order"))
                continue
            try:
                update = plan(record)
            except (IllegalTransition, ValueError) as exc:
                outcomes.append((order_id, f"refused: {exc}"))
                continue
            after = await store.update_state(order_id, update.expect, update.changes)
            if after is None:
                outcomes.append((order_id, "refused: the order changed meanwhile; look again"))
                continue
            await store.append_history(_event(order_id, event, record, by))
            outcomes.append((order_id, f"{record.process_state} -> {after.process_state}"))
    finally:
        await store.close()
    return outcomes


def _event(order_id: str, event: HistoryEventType, record: StateRecord, by: str) -> HistoryEvent:
    return HistoryEvent(
        order_id=order_id,
        type=event,
        at=utcnow(),
        attempt=record.attempt,
        data={"by": by, "from": record.process_state.value},
    )


def _report(outcomes: list[tuple[str, str]]) -> None:
    for order_id, outcome in outcomes:
        click.echo(f"{order_id}: {outcome}")
    if any(outcome.startswith("refused") for _, outcome in outcomes):
        sys.exit(1)


@click.group()
def orders() -> None:
    """Act on orders (every action is conditional and recorded in the order's history)."""


by_option = click.option(
    "--by",
    default=getpass.getuser,
    show_default="your user name",
    help="Who asked, for the history.",
)


@orders.command("resubmit")
@click.argument("order_ids", nargs=-1, required=True)
@click.option("--from-step", help="Start over from this step (default: the first not Completed).")
@click.option("--keep-failures", is_flag=True, help="Keep the failure count (default: reset it).")
@by_option
@click.pass_context
def resubmit_cmd(
    ctx: click.Context,
    order_ids: tuple[str, ...],
    from_step: str | None,
    keep_failures: bool,
    by: str,
) -> None:
    """Send orders in Error back to Pending, with a fresh retry budget."""
    settings: Settings = ctx.find_object(Settings)  # type: ignore[assignment]

    def plan(record: StateRecord) -> Update:
        workflow = get_workflow(record.workflow, record.workflow_version)
        if workflow is None:
            raise ValueError(f"unknown workflow {record.workflow} v{record.workflow_version}")
        return resubmit(
            record, workflow, now=utcnow(), from_step=from_step, reset_failures=not keep_failures
        )

    _report(asyncio.run(_act(settings, order_ids, plan, HistoryEventType.RESUBMITTED, by)))


@orders.command("compensate")
@click.argument("order_ids", nargs=-1, required=True)
@by_option
@click.pass_context
def compensate_cmd(ctx: click.Context, order_ids: tuple[str, ...], by: str) -> None:
    """Undo the completed steps of orders in Error or CompensationFailed."""
    settings: Settings = ctx.find_object(Settings)  # type: ignore[assignment]

    def plan(record: StateRecord) -> Update:
        return request_compensation(record, now=utcnow())

    _report(asyncio.run(_act(settings, order_ids, plan, HistoryEventType.COMPENSATION_STARTED, by)))
