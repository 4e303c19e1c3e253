"""The operator's endpoints (`/ops/…`): what the CLI's operator commands do, over HTTP.

Reading takes a `viewer` or `operator` token; acting takes an `operator` one, and every action
records the token's name in the order's history as who asked (`by`). The answers are the CLI's
`--json` values (services/operator/views.py and the modules beside it), so a script can use
either. Actions are the CLI's own (services/operator/actions.py): conditional on the order as
it was selected, refused with the reason otherwise; a bulk resubmission is a dry run first, or a
job whose progress `GET /ops/jobs/{job_id}` tells while it runs, paced at `rate` a second.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, HTTPException, Query
from pydantic import AwareDatetime, BaseModel, BeforeValidator, ConfigDict, Field

from services.api.auth import Operator, Viewer, context
from services.api.context import ApiContext, BulkJob
from services.api.models import ErrorBody, ShownJSON
from services.cli.dlq import body_text
from services.operator import actions
from services.operator.actions import COMPENSATE, Outcome, refused
from services.operator.cancellation import cancel_order, status_teller
from services.operator.explain import fingerprint, group_failures
from services.operator.stats import process_stats, queue_depths_on, store_stats
from services.operator.views import (
    matching,
    order_page,
    order_summary,
    order_view_in,
    parse_cursor,
    state_query,
    timeline_in,
)
from shared.broker import dead_letters
from shared.broker.connection import login_user
from shared.broker.senders import Senders
from shared.domain.durations import parse_duration
from shared.domain.journal import ALERT_ID_LIMIT, Alert, AlertAction, AlertState
from shared.domain.models import APP_ORDER_ID
from shared.domain.states import FAILED_STATES, ErrorKind, ProcessState
from shared.domain.text import shown_cut
from shared.domain.timing import utcnow
from shared.errors import BadInput
from shared.reporting import Reporter
from shared.store.port import StateQuery

log = logging.getLogger(__name__)

router = APIRouter(prefix="/ops", tags=["operator"], default_response_class=ShownJSON)
Context = Annotated[ApiContext, Depends(context)]
SYSTEM_ORDER_ID = rf"^([a-z][a-z0-9_-]{{0,39}}/)?{APP_ORDER_ID}$"
"""An order's id as the store holds it: the application's id, prefixed with its shop's name when
a shop placed it."""
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
Json = dict[str, Any]


def _bad(exc: BadInput | ValueError) -> HTTPException:
    return HTTPException(400, str(exc))


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
        raise _bad(exc) from None
    wanted = frozenset(states) if states else default
    return state_query(wanted, error_kind, age, now=utcnow())


class Body(BaseModel):
    """A request body: strict (`0` is no `false`: a lax reading once made `"dry_run": 0` a
    real run), and nothing unknown."""

    model_config = ConfigDict(strict=True, extra="forbid")


class Filters(BaseModel):
    """Which orders: these states (any: all), this error kind, last changed longer ago than
    `older_than` (90s, 15m, 2h, 1d), stopped at this step."""

    state: list[ProcessState] | None = None
    error_kind: ErrorKind | None = None
    older_than: str | None = Field(default=None, max_length=20)
    step: str | None = Field(default=None, pattern=r"^[a-z][a-z0-9_-]{0,31}$")


def filters(
    state: Annotated[list[ProcessState] | None, Query()] = None,
    error_kind: ErrorKind | None = None,
    older_than: Annotated[str | None, Query(max_length=20)] = None,
    step: Annotated[str | None, Query(pattern=r"^[a-z][a-z0-9_-]{0,31}$")] = None,
) -> Filters:
    return Filters(state=state, error_kind=error_kind, older_than=older_than, step=step)


Filtered = Annotated[Filters, Depends(filters)]


@router.get("/orders", responses=ERRORS)
async def list_orders(
    ctx: Context,
    who: Viewer,
    where: Filtered,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    cursor: Annotated[str | None, Query(max_length=200)] = None,
) -> Json:
    """Orders, most recently changed first; `next` continues the listing (as `cursor`)."""
    query = _query(where.state, where.error_kind, where.older_than)
    try:
        page = await order_page(ctx.store, query, where.step, parse_cursor(cursor), limit)
    except BadInput as exc:
        raise _bad(exc) from None
    now = utcnow()
    return {"orders": [order_summary(r, now) for r in page.records], "next": page.next}


@router.get("/failures", responses=ERRORS)
async def failure_groups(ctx: Context, who: Viewer, where: Filtered) -> Json:
    """Failed orders (Error, CompensationFailed, unless states are asked for) grouped by error
    kind and message fingerprint, biggest group first."""
    query = _query(where.state, where.error_kind, where.older_than, default=FAILED_STATES)
    try:
        found = [r async for r in matching(ctx.store, query, where.step, None)]
    except BadInput as exc:
        raise _bad(exc) from None
    return {"groups": [g.to_json() for g in group_failures(found)]}


@router.get("/order", responses={**ERRORS, **NOT_FOUND})
async def show_order(ctx: Context, who: Viewer, order_id: SystemOrderId) -> Json:
    """One order (`orders show`): data, state, steps, budget, lease, undo log, what's next.
    The id is a query parameter: the system's ids may hold a '/'."""
    try:
        return await order_view_in(ctx.store, ctx.settings, order_id)
    except BadInput as exc:
        raise HTTPException(404, str(exc)) from None


@router.get("/order/history", responses={**ERRORS, **NOT_FOUND})
async def order_history(ctx: Context, who: Viewer, order_id: SystemOrderId) -> Json:
    """The order's timeline (`orders history`), oldest first."""
    try:
        return {"events": await timeline_in(ctx.store, ctx.settings, order_id)}
    except BadInput as exc:
        raise HTTPException(404, str(exc)) from None


class ResubmitOne(Body):
    from_step: str | None = Field(default=None, pattern=r"^[a-z][a-z0-9_-]{0,31}$")
    """Start over from this step (default: the first not Completed)."""
    keep_failures: bool = False
    """Keep the failure count (default: reset it)."""


class ActionResult(BaseModel):
    order_id: str
    outcome: str
    """`Error -> Pending`, `would go …`, or `refused: why`."""
    refused: bool


def _result(outcome: Outcome) -> ActionResult:
    return ActionResult(order_id=outcome[0], outcome=outcome[1], refused=refused(outcome[1]))


CONFLICT: dict[int | str, dict[str, Any]] = {
    409: {"model": ActionResult, "description": "Refused: the order is not in a state for it."}
}


async def _one(ctx: ApiContext, order_id: str, action: actions.Action, by: str) -> ActionResult:
    outcome = await actions.act(
        ctx.store, actions.Selection([(order_id, None)]), action, by, dry_run=False, rate=None
    )
    result = _result(outcome[0])
    if result.refused:
        status = 404 if result.outcome.endswith("no such order") else 409
        raise HTTPException(status, result.outcome)
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
    tell = status_teller(Reporter(ctx.store, ctx.status_publisher, ctx.names, who.name))
    outcome = await cancel_order(ctx.store, order_id, by=who.name, tell=tell)
    if outcome.refused is not None:
        raise HTTPException(404 if outcome.before is None else 409, f"refused: {outcome.refused}")
    return ActionResult(order_id=order_id, outcome=str(outcome), refused=False)


def _iso_text(value: Any) -> Any:
    """A time on the wire is ISO 8601 text, never a number of seconds (which pydantic would
    read as one, and the document does not allow)."""
    if isinstance(value, datetime):
        return value
    if not isinstance(value, str):
        raise ValueError("a time is ISO 8601 text with its offset (2026-01-01T00:00:00Z)")
    try:
        return datetime.fromisoformat(value)
    except ValueError:
        raise ValueError("a time is ISO 8601 text with its offset (2026-01-01T00:00:00Z)") from None


WireTime = Annotated[AwareDatetime, BeforeValidator(_iso_text)]


class Selected(Body):
    order_id: str = Field(pattern=SYSTEM_ORDER_ID, max_length=105)
    seen: WireTime
    """Its last change when it was selected: it is acted on only if it has not changed since."""


class BulkResubmit(Body):
    """Resubmit every order in Error the filters select (and, when given, whose error has
    this fingerprint: one failure group). With `selected` (what a dry run answered), exactly
    those orders, each only if it has not changed since and still matches the filters."""

    error_kind: ErrorKind | None = Field(default=None, strict=False)  # its value, as text
    fingerprint: str | None = Field(default=None, max_length=2000)
    older_than: str | None = Field(default=None, max_length=20)
    step: str | None = Field(default=None, pattern=r"^[a-z][a-z0-9_-]{0,31}$")
    from_step: str | None = Field(default=None, pattern=r"^[a-z][a-z0-9_-]{0,31}$")
    keep_failures: bool = False
    rate: float = Field(default=20.0, ge=0.1, le=10_000)
    """Resubmissions per second at most."""
    dry_run: bool = True
    """Say what each order would become, change nothing (the default: look first)."""
    selected: list[Selected] | None = Field(default=None, max_length=100_000)


class JobView(BaseModel):
    job_id: str
    by: str
    total: int
    done: int
    finished: bool
    error: str | None = None
    changed: int
    refused: int
    outcomes: list[ActionResult]
    selected: list[Selected]
    """The orders selected, as selected: send them back with the real run to act on these."""


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
    try:
        found = [r async for r in matching(ctx.store, query, body.step, None)]
    except BadInput as exc:
        raise _bad(exc) from None
    if body.fingerprint is not None:
        found = [r for r in found if r.error and fingerprint(r.error.message) == body.fingerprint]
    if body.selected is not None:
        # As the dry run saw them: an order that changed since, or no longer matches, is
        # refused by the action; one that matches now but was not shown is left alone.
        orders = [(o.order_id, o.seen) for o in body.selected]
        return actions.Selection(orders, query, body.step)
    return actions.Selection([(r.order_id, r.updated_at) for r in found], query, body.step)


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
        job.outcomes = await actions.act(
            ctx.store, selection, action, who.name, dry_run=True, rate=None
        )
        job.done, job.finished = job.total, True
        return _job_view(job, selection)
    ctx.jobs[job.job_id] = job

    def progress(done: int, total: int) -> None:
        job.done, job.total = done, total

    async def run() -> None:
        try:
            job.outcomes = await actions.act(
                ctx.store, selection, action, who.name, dry_run=False, rate=body.rate,
                progress=progress,
            )  # fmt: skip
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
        raise HTTPException(404, f"no job {job_id} (jobs live as long as the API process)")
    return _job_view(found)


InputQueue = Literal["orders", "inventory", "payment", "shipping"]
QueueName = Annotated[
    InputQueue | None, Query(description="One input queue's dead letters; default all.")
]


def _sources(ctx: ApiContext, queue: str | None) -> list[str]:
    try:
        return dead_letters.source_queues(ctx.names, queue)
    except BadInput as exc:
        raise _bad(exc) from None


@router.get("/dead-letters", responses=ERRORS)
async def list_dead_letters(ctx: Context, who: Viewer, queue: QueueName = None) -> Json:
    """Dead-lettered messages with their reasons (they stay where they are)."""
    rows = await dead_letters.dead_letters(ctx.operator_connection, _sources(ctx, queue))
    return {"messages": rows}


@router.get("/dead-letter", responses={**ERRORS, **NOT_FOUND})
async def show_dead_letter(
    ctx: Context,
    who: Viewer,
    message_id: Annotated[str, Query(min_length=1, max_length=300)],
    queue: QueueName = None,
) -> Json:
    """One dead-lettered message: its reason, headers and body (payment tokens shortened)."""
    found = await dead_letters.find(ctx.operator_connection, _sources(ctx, queue), message_id)
    if not found:
        raise HTTPException(404, f"no dead letter {message_id}")
    return {"messages": [f.row | {"body": body_text(f.body)} for f in found]}


class Replay(Body):
    message_ids: list[Annotated[str, Field(min_length=1, max_length=300)]] | None = Field(
        default=None, max_length=10_000
    )
    """These dead letters (none given: every one of the queue)."""
    queue: InputQueue | None = None


@router.post("/dead-letters/replay", responses=ERRORS)
async def replay_dead_letters(ctx: Context, who: Operator, body: Replay) -> Json:
    """Send dead letters back to their queue, each removed from its DLQ once confirmed."""
    settings = ctx.settings
    url = settings.api_rabbitmq_url or settings.rabbitmq_url
    senders = Senders.of(settings.hub, settings.broker_user_prefix, login_user(url), "api")
    done = await dead_letters.replay(
        ctx.operator_connection,
        ctx.names,
        _sources(ctx, body.queue),
        body.message_ids,
        by=who.name,
        senders=senders,
        publish_timeout_s=settings.publish_timeout_s,
    )
    return {"replayed": done.replayed, "unsealed": done.unsealed, "not_found": done.not_found}


@router.delete("/dead-letters", responses=ERRORS)
async def purge_dead_letters(
    ctx: Context,
    who: Operator,
    confirm: Annotated[Literal["purge"], Query(description="`purge`: this cannot be undone.")],
    queue: QueueName = None,
) -> Json:
    """Delete dead-lettered messages for good."""
    return {"purged": await dead_letters.purge(ctx.operator_connection, _sources(ctx, queue))}


@router.get("/alerts", responses=ERRORS)
async def alerts(
    ctx: Context,
    who: Viewer,
    since: Annotated[WireTime | None, Query()] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> Json:
    """Stored alerts raised after `since` (ISO 8601, with its offset), newest first."""
    found = await ctx.store.list_alerts(since=since, limit=limit)
    states = await ctx.store.alert_states([a.alert_id for a in found])
    return {"alerts": [_with_state(a, states.get(a.alert_id)) for a in found]}


def _with_state(alert: Alert, state: AlertState | None) -> Json:
    """An alert as JSON, with who acknowledged and resolved it and when (null: not yet)."""
    state = state or AlertState(alert_id=alert.alert_id)
    return alert.model_dump(mode="json") | state.model_dump(mode="json", exclude={"alert_id"})


AlertId = Annotated[
    str,
    # As stored: printable (an alert id is escaped when raised), so never a NUL, which the
    # store could not even look up.
    Query(min_length=1, max_length=ALERT_ID_LIMIT, pattern=r"^[^\x00-\x1f\x7f]+$"),
]
NO_ALERT: dict[int | str, dict[str, Any]] = {
    404: {"model": ErrorBody, "description": "No such alert."}
}


async def _mark(ctx: ApiContext, alert_id: str, action: AlertAction, by: str) -> Json:
    state = await ctx.store.mark_alert(alert_id, action, by=by, at=utcnow())
    if state is None:
        raise HTTPException(404, f"no alert {alert_id!r}")
    return state.model_dump(mode="json")


@router.post("/alert/acknowledge", responses={**ERRORS, **NO_ALERT})
async def acknowledge_alert(ctx: Context, who: Operator, alert_id: AlertId) -> Json:
    """Record that the token's holder is on this alert (`alerts ack`): the notifier sends
    PagerDuty an `acknowledge`. The first acknowledgement stands."""
    return await _mark(ctx, alert_id, AlertAction.ACKNOWLEDGE, who.name)


@router.post("/alert/resolve", responses={**ERRORS, **NO_ALERT})
async def resolve_alert(ctx: Context, who: Operator, alert_id: AlertId) -> Json:
    """Record that this alert's condition is over (`alerts resolve`): the notifier sends
    PagerDuty a `resolve`. The first resolution stands."""
    return await _mark(ctx, alert_id, AlertAction.RESOLVE, who.name)


@router.get("/stats", responses=ERRORS)
async def stats(ctx: Context, who: Viewer) -> Json:
    """Orders per state, stuck and overdue orders, queue depths, processes, open circuit
    breakers and the supervisor leader (`orderflow stats`)."""
    snapshot = await store_stats(ctx.store, ctx.settings)
    snapshot["queues"] = await queue_depths_on(ctx.operator_connection, ctx.names)
    return snapshot


@router.get("/processes", responses=ERRORS)
async def processes(ctx: Context, who: Viewer) -> Json:
    """The processes reporting, their open circuit breakers and intake, the leader."""
    return await process_stats(ctx.store, now=utcnow())


__all__ = ["router"]
