"""`orderflow orders resubmit|compensate`: act on orders, as the operator selected them.

The actions themselves (selection, conditional writes, pacing, refusals) are
`services/operator/actions.py`; this module parses the options, shows progress on a terminal and
reports what changed and what was refused (exit 1 if any was).
"""

from __future__ import annotations

import getpass
import re
import sys
from collections import defaultdict
from typing import Any

import click

from services.cli.operations import run_operations
from services.cli.orders import check_ids, duration_of, kind_choice, kind_of, orders
from services.cli.render import echo_json, plain, progress_bar
from services.cli.settings import pass_settings
from services.operator import actions
from services.operator.actions import COMPENSATE, Action, Chooser, Outcome, refused
from services.operator.cancellation import CancelOutcome
from services.operator.explain import Undo
from services.operator.operations import Operations
from services.operator.views import state_query
from shared.config import Settings
from shared.domain.states import ProcessState
from shared.domain.timing import utcnow
from shared.errors import BadInput
from shared.store.port import StateQuery

__all__ = ["orders"]  # the `orders` group, with these commands registered on it

by_option = click.option(
    "--by",
    default=getpass.getuser,
    show_default="your user name",
    help="Who asked, for the history.",
)


def _reason(outcome: str) -> str:
    """A refusal without its order-specific details, to count refusals by cause."""
    return re.sub(r"\b(?:ord|o)-[A-Za-z0-9._-]+", "#", outcome)


def count_by(items: list[str]) -> dict[str, int]:
    counts: dict[str, int] = defaultdict(int)
    for item in items:
        counts[item] += 1
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def report(outcomes: list[Outcome], *, as_json: bool, dry_run: bool) -> None:
    """What changed and what was refused and why; exit 1 if any was refused."""
    done = [(o, r) for o, r in outcomes if not refused(r)]
    refusals = [(o, r) for o, r in outcomes if refused(r)]
    if as_json:
        echo_json(
            {
                "dry_run": dry_run,
                "done": [{"order_id": o, "outcome": r} for o, r in done],
                "refused": [{"order_id": o, "reason": r} for o, r in refusals],
            }
        )
    else:
        for order_id, outcome in outcomes if len(outcomes) <= 50 else refusals[:50]:
            click.echo(plain(f"{order_id}: {outcome}"))
        verb = "would be changed" if dry_run else "changed"
        click.echo(f"{len(done)} {verb}, {len(refusals)} refused")
        for reason, n in count_by([_reason(r) for _, r in refusals]).items():
            click.echo(plain(f"  {n} x {reason}"))
    if refusals:
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
) -> list[Outcome]:
    """Select the orders, then act on them as selected, with a progress bar on a terminal."""

    def run(progress: actions.Progress | None) -> list[Outcome]:
        async def select_then_act(ops: Operations) -> list[Outcome]:
            selection = await ops.select(choose)
            return await ops.act(
                selection, action, by, dry_run=dry_run, rate=rate, progress=progress
            )

        return run_operations(settings, select_then_act)

    if as_json or not bar or not sys.stderr.isatty():
        return run(None)
    with progress_bar() as update:
        return run(lambda done, total: update("orders", done, total))


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
        actions.named(order_ids)
        if state is None
        else actions.queried(_selection(state, error_kind, older_than), step)
    )
    outcomes = _run_actions(
        settings,
        choose,
        actions.resubmit_action(from_step, keep_failures=keep_failures),
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
    undo = _plans_shown(run_operations(settings, lambda ops: ops.undo_plans(order_ids)))
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
        actions.named(order_ids),
        COMPENSATE,
        by,
        dry_run=dry_run,
        rate=None,
        as_json=as_json,
        bar=len(order_ids) > 1,
    )
    if as_json:
        done = [{"order_id": o, "outcome": r, "plan": undo[o]} for o, r in outcomes]
        echo_json({"dry_run": dry_run, "orders": done})
        if any(refused(r) for _, r in outcomes):
            sys.exit(1)
        return
    report(outcomes, as_json=False, dry_run=dry_run)


@orders.command("cancel")
@click.argument("order_ids", nargs=-1, required=True)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@by_option
@pass_settings()
def cancel_cmd(settings: Settings, order_ids: tuple[str, ...], as_json: bool, by: str) -> None:
    """Cancel orders for their customers (as the shop's `POST /orders/{id}/cancel` does).

    An order none of whose steps was sent becomes Cancelled at once, and its application is
    told; one that has begun (Processing, or Pending or in Error after an attempt) is
    compensated: its running attempt is fenced out, the steps it made are undone, newest
    first, and it ends Compensated. A Processed order, or one already compensated or being
    compensated, is refused with the reason (exit 1)."""
    check_ids(order_ids)

    async def cancel_each(ops: Operations) -> list[CancelOutcome]:
        return [await ops.cancel(order_id, by=by) for order_id in order_ids]

    outcomes = run_operations(settings, cancel_each, name="orderflow-cancel", publisher=True)
    report([(o.order_id, str(o)) for o in outcomes], as_json=as_json, dry_run=False)


def _selection(state: str, error_kind: str | None, older_than: str | None) -> StateQuery:
    return state_query(
        frozenset({ProcessState(state)}), kind_of(error_kind), duration_of(older_than), now=utcnow()
    )


def _plans_shown(plans: dict[str, list[Undo]]) -> dict[str, list[dict[str, Any]]]:
    return {
        order_id: [
            {
                "step": u.step,
                "undo": u.operation,
                "idempotency_key": u.idempotency_key,
                "status": u.status.value,
                "will_run": u.will_run,
            }
            for u in undo
        ]
        for order_id, undo in plans.items()
    }
