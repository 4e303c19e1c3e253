"""The operator's endpoints (`/ops/…`): what the CLI's operator commands do, over HTTP.

Reading takes a `viewer` or `operator` token; acting takes an `operator` one, and every action
records the token's name in the order's history as who asked (`by`). The answers are the CLI's
`--json` values, from the same methods of the operator's application layer
(services/operator/operations.py: `ctx.ops`, built once at the API's start), so a script can
use either; its `NotFound` is a 404 and its `BadInput` a 400 (services/api/app.py). Actions are
the CLI's own (services/operator/actions.py): conditional on the order as it was selected,
refused with the reason otherwise; a bulk resubmission is a dry run first, or a job whose
progress `GET /ops/jobs/{job_id}` tells while it runs, paced at `rate` a second.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, HTTPException, Query

from services.api.auth import Operator, Viewer, context
from services.api.context import ApiContext, BulkJob
from services.api.models import (
    SYSTEM_ORDER_ID,
    ActionResult,
    BulkResubmit,
    ErrorBody,
    Filters,
    InputQueue,
    JobView,
    Replay,
    ResubmitOne,
    Selected,
    ShownJSON,
    WireTime,
)
from services.operator import actions
from services.operator.actions import COMPENSATE, Outcome, refused
from services.operator.results import (
    AlertList,
    DeadLetters,
    FailureGroups,
    History,
    OrderList,
    OrderView,
    Processes,
    Purged,
    ReplayResult,
    ShownDeadLetters,
    Stats,
    alert_row,
)
from services.operator.views import order_summary, parse_cursor, state_query
from shared.domain.durations import parse_duration
from shared.domain.journal import ALERT_ID_LIMIT, AlertAction, AlertState
from shared.domain.states import FAILED_STATES, ErrorKind, ProcessState
from shared.domain.text import shown_cut
from shared.domain.timing import utcnow
from shared.errors import BadInput, NotFound
from shared.store.port import StateQuery

log = logging.getLogger(__name__)

router = APIRouter(prefix="/ops", tags=["operator"], default_response_class=ShownJSON)
Context = Annotated[ApiContext, Depends(context)]
SystemOrderId = Annotated[str, Query(pattern=SYSTEM_ORDER_ID, max_length=105)]
ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorBody, "description": "A filter or a value that makes no sense."},
    401: {"model": ErrorBody, "description": "No token, or an unknown or revoked one."},
    403: {"model": ErrorBody, "description": "The token's role may not do this."},
    503: {"model": ErrorBody, "description": "A server orderflow needs is unavailable."},
}
NOT_FOUND: dict[int | str, dict[str, Any]] = {
    404: {"model": ErrorBody, "description": "No such order (or its history expired)."}
}


def _query(
    states: list[ProcessState] | None,
    error_kind: ErrorKind | None,
    older_than: str | None,
    *,
    default: frozenset[ProcessState] | None = None,
) -> StateQuery:
    try:
        age = parse_duration(older_than) if older_than else None
    except ValueError as exc:
        raise BadInput(str(exc)) from None
    wanted = frozenset(states) if states else default
    return state_query(wanted, error_kind, age, now=utcnow())


def filters(
    state: Annotated[list[ProcessState] | None, Query()] = None,
    error_kind: ErrorKind | None = None,
    older_than: Annotated[str | None, Query(max_length=20)] = None,
    step: Annotated[str | None, Query(pattern=r"^[a-z][a-z0-9_-]{0,31}$")] = None,
) -> Filters:
    return Filters(state=state, error_kind=error_kind, older_than=older_than, step=step)


Filtered = Annotated[Filters, Depends(filters)]


@router.get("/orders", response_model=OrderList, responses=ERRORS)
async def list_orders(
    ctx: Context,
    who: Viewer,
    where: Filtered,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    cursor: Annotated[str | None, Query(max_length=200)] = None,
) -> OrderList:
    """Orders, most recently changed first; `next` continues the listing (as `cursor`)."""
    query = _query(where.state, where.error_kind, where.older_than)
    page = await ctx.ops.orders(query, where.step, parse_cursor(cursor), limit)
    now = utcnow()
    return OrderList(orders=[order_summary(r, now) for r in page.records], next=page.next)


@router.get("/failures", response_model=FailureGroups, responses=ERRORS)
async def failure_groups(ctx: Context, who: Viewer, where: Filtered) -> FailureGroups:
    """Failed orders (Error, CompensationFailed, unless states are asked for) grouped by error
    kind and message fingerprint, biggest group first."""
    query = _query(where.state, where.error_kind, where.older_than, default=FAILED_STATES)
    groups = await ctx.ops.failures(query, where.step)
    return FailureGroups(groups=[g.view() for g in groups])


@router.get("/order", response_model=OrderView, responses={**ERRORS, **NOT_FOUND})
async def show_order(ctx: Context, who: Viewer, order_id: SystemOrderId) -> OrderView:
    """One order (`orders show`): data, state, steps, budget, lease, undo log, what's next.
    The id is a query parameter: the system's ids may hold a '/'."""
    return await ctx.ops.order(order_id)


@router.get("/order/history", response_model=History, responses={**ERRORS, **NOT_FOUND})
async def order_history(ctx: Context, who: Viewer, order_id: SystemOrderId) -> History:
    """The order's timeline (`orders history`), oldest first."""
    return History(events=await ctx.ops.timeline(order_id))


def _result(outcome: Outcome) -> ActionResult:
    return ActionResult(order_id=outcome[0], outcome=outcome[1], refused=refused(outcome[1]))


CONFLICT: dict[int | str, dict[str, Any]] = {
    409: {"model": ErrorBody, "description": "Refused: the order is not in a state for it."}
}


async def _one(ctx: ApiContext, order_id: str, action: actions.Action, by: str) -> ActionResult:
    selection = actions.Selection([(order_id, None)])
    outcome = await ctx.ops.act(selection, action, by, dry_run=False, rate=None)
    result = _result(outcome[0])
    if result.refused:
        if result.outcome.endswith("no such order"):
            raise NotFound(result.outcome)
        raise HTTPException(409, result.outcome)
    return result


@router.post(
    "/order/resubmit", response_model=ActionResult, responses={**ERRORS, **CONFLICT, **NOT_FOUND}
)
async def resubmit_one(
    ctx: Context, who: Operator, order_id: SystemOrderId, body: ResubmitOne
) -> ActionResult:
    """Send an order in Error back to Pending with a fresh retry budget (`orders resubmit`)."""
    action = actions.resubmit_action(body.from_step, keep_failures=body.keep_failures)
    return await _one(ctx, order_id, action, who.name)


@router.post(
    "/order/compensate",
    response_model=ActionResult,
    responses={**ERRORS, **CONFLICT, **NOT_FOUND},
)
async def compensate_one(ctx: Context, who: Operator, order_id: SystemOrderId) -> ActionResult:
    """Undo the completed steps of an order in Error or CompensationFailed, newest first."""
    return await _one(ctx, order_id, COMPENSATE, who.name)


@router.post(
    "/order/cancel", response_model=ActionResult, responses={**ERRORS, **CONFLICT, **NOT_FOUND}
)
async def cancel_one(ctx: Context, who: Operator, order_id: SystemOrderId) -> ActionResult:
    """Cancel an order for its customer (`orders cancel`)."""
    # Its application is told on the order's status queue, through the API's own publisher.
    outcome = await ctx.ops.cancel(order_id, by=who.name)
    if outcome.refused is not None:
        if outcome.before is None:
            raise NotFound(f"refused: {outcome.refused}")
        raise HTTPException(409, f"refused: {outcome.refused}")
    return ActionResult(order_id=order_id, outcome=str(outcome), refused=False)


def _job_view(job: BulkJob, selection: actions.Selection | None = None) -> JobView:
    results = [_result(o) for o in job.outcomes]
    chosen = selection.orders if selection is not None else []
    return JobView(
        job_id=job.job_id,
        by=job.by,
        total=job.total,
        done=job.done,
        finished=job.finished,
        error=job.error,
        changed=sum(not r.refused for r in results),
        refused=sum(r.refused for r in results),
        outcomes=results,
        selected=[Selected(order_id=o, seen=seen) for o, seen in chosen if seen is not None],
    )


async def _selection(ctx: ApiContext, body: BulkResubmit) -> actions.Selection:
    query = _query([ProcessState.ERROR], body.error_kind, body.older_than)
    chosen = await ctx.ops.select(actions.queried(query, body.step, body.fingerprint))
    if body.selected is not None:
        # As the dry run saw them: an order that changed since, or no longer matches, is
        # refused by the action; one that matches now but was not shown is left alone.
        orders = [(o.order_id, o.seen) for o in body.selected]
        return actions.Selection(orders, query, body.step)
    return chosen


@router.post(
    "/resubmit",
    response_model=JobView,
    responses={**ERRORS, 202: {"model": JobView, "description": "Started: follow the job."}},
)
async def bulk_resubmit(ctx: Context, who: Operator, body: BulkResubmit) -> JobView:
    """Resubmit a selection of orders in Error: a dry run (the default) answers at once what
    each would become; otherwise a job starts, paced at `rate`, each order refused if it
    changed since it was selected or no longer matches."""
    selection = await _selection(ctx, body)
    action = actions.resubmit_action(body.from_step, keep_failures=body.keep_failures)
    job = BulkJob(ctx.next_job_id(), who.name, total=len(selection.orders))
    if body.dry_run:
        job.outcomes = await ctx.ops.act(selection, action, who.name, dry_run=True, rate=None)
        job.done, job.finished = job.total, True
        return _job_view(job, selection)
    ctx.jobs[job.job_id] = job

    def progress(done: int, total: int) -> None:
        job.done, job.total = done, total

    async def run() -> None:
        try:
            job.outcomes = await ctx.ops.act(
                selection, action, who.name, dry_run=False, rate=body.rate, progress=progress
            )
        except Exception as exc:  # the job reports it; the API goes on
            log.exception("bulk resubmission failed", extra={"job": job.job_id})
            job.error = shown_cut(str(exc), 500)
        finally:
            job.finished = True

    job.task = asyncio.create_task(run())
    return _job_view(job, selection)


@router.get(
    "/jobs/{job_id}",
    response_model=JobView,
    responses={**ERRORS, 404: {"model": ErrorBody, "description": "No such job."}},
)
async def job(ctx: Context, who: Viewer, job_id: str) -> JobView:
    """A bulk resubmission's progress, and its outcomes once finished."""
    found = ctx.jobs.get(job_id)
    if found is None:
        raise NotFound(f"no job {job_id} (jobs live as long as the API process)")
    return _job_view(found)


QueueName = Annotated[
    InputQueue | None, Query(description="One input queue's dead letters; default all.")
]


@router.get("/dead-letters", response_model=DeadLetters, responses=ERRORS)
async def list_dead_letters(ctx: Context, who: Viewer, queue: QueueName = None) -> DeadLetters:
    """Dead-lettered messages with their reasons (they stay where they are)."""
    return DeadLetters(messages=await ctx.ops.dead_letters(queue))


@router.get("/dead-letter", response_model=ShownDeadLetters, responses={**ERRORS, **NOT_FOUND})
async def show_dead_letter(
    ctx: Context,
    who: Viewer,
    message_id: Annotated[str, Query(min_length=1, max_length=300)],
    queue: QueueName = None,
) -> ShownDeadLetters:
    """One dead-lettered message: its reason, headers and body (payment tokens shortened)."""
    return ShownDeadLetters(messages=await ctx.ops.dead_letter(message_id, queue))


@router.post("/dead-letters/replay", response_model=ReplayResult, responses=ERRORS)
async def replay_dead_letters(ctx: Context, who: Operator, body: Replay) -> ReplayResult:
    """Send dead letters back to their queue, each removed from its DLQ once confirmed."""
    return await ctx.ops.replay(body.message_ids, body.queue, by=who.name)


@router.delete("/dead-letters", response_model=Purged, responses=ERRORS)
async def purge_dead_letters(
    ctx: Context,
    who: Operator,
    confirm: Annotated[Literal["purge"], Query(description="`purge`: this cannot be undone.")],
    queue: QueueName = None,
) -> Purged:
    """Delete dead-lettered messages for good."""
    return Purged(purged=await ctx.ops.purge(queue))


@router.get("/alerts", response_model=AlertList, responses=ERRORS)
async def alerts(
    ctx: Context,
    who: Viewer,
    since: Annotated[WireTime | None, Query()] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> AlertList:
    """Stored alerts raised after `since` (ISO 8601, with its offset), newest first."""
    found = await ctx.ops.alerts(since, limit)
    return AlertList(alerts=[alert_row(a, state) for a, state in found])


AlertId = Annotated[
    str,
    # As stored: printable (an alert id is escaped when raised), so never a NUL, which the
    # store could not even look up.
    Query(min_length=1, max_length=ALERT_ID_LIMIT, pattern=r"^[^\x00-\x1f\x7f]+$"),
]
NO_ALERT: dict[int | str, dict[str, Any]] = {
    404: {"model": ErrorBody, "description": "No such alert."}
}


@router.post("/alert/acknowledge", response_model=AlertState, responses={**ERRORS, **NO_ALERT})
async def acknowledge_alert(ctx: Context, who: Operator, alert_id: AlertId) -> AlertState:
    """Record that the token's holder is on this alert (`alerts ack`): the notifier sends
    PagerDuty an `acknowledge`. The first acknowledgement stands."""
    return await ctx.ops.mark_alert(alert_id, AlertAction.ACKNOWLEDGE, by=who.name)


@router.post("/alert/resolve", response_model=AlertState, responses={**ERRORS, **NO_ALERT})
async def resolve_alert(ctx: Context, who: Operator, alert_id: AlertId) -> AlertState:
    """Record that this alert's condition is over (`alerts resolve`): the notifier sends
    PagerDuty a `resolve`. The first resolution stands."""
    return await ctx.ops.mark_alert(alert_id, AlertAction.RESOLVE, by=who.name)


@router.get("/stats", response_model=Stats, responses=ERRORS)
async def stats(ctx: Context, who: Viewer) -> Stats:
    """Orders per state, stuck and overdue orders, queue depths, processes, open circuit
    breakers and the supervisor leader (`orderflow stats`)."""
    return await ctx.ops.stats()


@router.get("/processes", response_model=Processes, responses=ERRORS)
async def processes(ctx: Context, who: Viewer) -> Processes:
    """The processes reporting, their open circuit breakers and intake, the leader."""
    return await ctx.ops.processes()


__all__ = ["router"]
