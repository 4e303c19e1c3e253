"""The order views: what `orderflow orders list|show|history` and `/ops/order…` read from the
store, as values (services/operator/results.py).

Each view is the value its command prints with `--json`; the command's table is drawn from the
same value. A listing is read newest change first, in pages, and says so when it stops at
SCAN_CAP records.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from services.operator.explain import current_step, next_action, step_rows, undo_plan
from services.operator.results import (
    ErrorAt,
    ErrorBrief,
    OrderSummary,
    OrderView,
    RetryBudget,
    StateView,
    TimelineEvent,
    UndoRow,
)
from shared.config import RetentionSettings, SupervisorSettings
from shared.domain.models import OrderData, StateRecord
from shared.domain.redaction import short_token
from shared.domain.states import ErrorKind, ProcessState
from shared.domain.timing import utcnow
from shared.errors import BadInput, NotFound
from shared.store.port import ListCursor, StateQuery, StateStore

SCAN_CAP = 100_000
"""The most records one listing or bulk action reads; it says so when it stops there."""
PAGE = 500


def state_query(
    states: frozenset[ProcessState] | None,
    error_kind: ErrorKind | None,
    older_than: timedelta | None,
    *,
    now: datetime,
) -> StateQuery:
    """The operator's filter: these states, this error kind, last changed before `older_than`."""
    return StateQuery(
        states=states,
        changed_before=None if older_than is None else now - older_than,
        error_kind=error_kind,
    )


def parse_cursor(text: str | None) -> ListCursor | None:
    """The cursor a listing printed (`cursor_text`), to continue it."""
    if text is None:
        return None
    at, sep, order_id = text.partition("|")
    try:
        if not sep:
            raise ValueError(text)
        return ListCursor(datetime.fromisoformat(at), order_id)
    except ValueError:
        raise BadInput(f"not a cursor from `orders list`: {text!r}") from None


def cursor_text(record: StateRecord) -> str:
    return f"{record.updated_at.isoformat()}|{record.order_id}"


async def all_states(store: StateStore, page: int = 5000) -> list[StateRecord]:
    """Every state record of the hub, read in pages of `page`."""
    states: list[StateRecord] = []
    after: str | None = None
    while batch := await store.list_states(after=after, limit=page):
        states += batch
        after = batch[-1].order_id
    return states


async def matching(
    store: StateStore, query: StateQuery, step: str | None, after: ListCursor | None
) -> AsyncIterator[StateRecord]:
    """Records matching the query and the step, newest change first, up to SCAN_CAP read."""
    read = 0
    while read < SCAN_CAP:
        page = await store.query_states(query, limit=PAGE, after=after)
        if not page:
            return
        read += len(page)
        for record in page:
            if step is None or current_step(record) == step:
                yield record
        after = ListCursor(page[-1].updated_at, page[-1].order_id)
    raise BadInput(f"more than {SCAN_CAP} records match: narrow the filter")


@dataclass(frozen=True)
class OrderPage:
    """One page of a listing, and the cursor of the next one (None: no more)."""

    records: list[StateRecord]
    next: str | None


async def order_page(
    store: StateStore, query: StateQuery, step: str | None, after: ListCursor | None, limit: int
) -> OrderPage:
    """The orders matching, most recently changed first, `limit` at most."""
    found: list[StateRecord] = []
    async for record in matching(store, query, step, after):
        found.append(record)
        if len(found) > limit:
            break
    more = len(found) > limit
    records = found[:limit]
    return OrderPage(records, cursor_text(records[-1]) if more and records else None)


def order_summary(r: StateRecord, now: datetime) -> OrderSummary:
    """An order's line in a listing."""
    return OrderSummary(
        order_id=r.order_id,
        state=r.process_state.value,
        step=current_step(r),
        attempt=r.attempt,
        failures=r.failure_count,
        error=None
        if r.error is None
        else ErrorBrief(kind=r.error.kind.value, message=r.error.message),
        updated_at=r.updated_at.isoformat(),
        cursor=cursor_text(r),
    )


async def order_view(
    store: StateStore,
    order_id: str,
    *,
    hub: str,
    supervisor: SupervisorSettings,
    retention: RetentionSettings,
) -> OrderView:
    """An order: its data (the payment token by its start only), state, steps, retry budget,
    lease, undo log and what happens next; NotFound when the store has none of it."""
    record = await store.get_state(order_id)
    order = await store.get_order(order_id)
    log = await store.read_compensation(order_id)
    if record is None and order is None:
        raise NotFound(f"no order {order_id} in hub {hub}{purged_note(retention)}")
    now = utcnow()
    return OrderView(
        order_id=order_id,
        order=None if order is None else order_data_view(order.data),
        received_at=None if order is None else order.received_at.isoformat(),
        state=None if record is None else state_view(record, supervisor, now),
        compensation=[
            UndoRow(
                step=u.step,
                undo=u.operation,
                idempotency_key=u.idempotency_key,
                status=u.status.value,
            )
            for u in undo_plan(log)
        ],
    )


def order_data_view(data: OrderData) -> dict[str, Any]:
    """An order's data as every view shows it: its payment token by its start only (the CLI's,
    the API's and so the console's; the shop's own views show none)."""
    return data.model_dump(mode="json") | {"payment_token": short_token(data.payment_token)}


def state_view(r: StateRecord, supervisor: SupervisorSettings, now: datetime) -> StateView:
    error = r.error
    return StateView(
        process_state=r.process_state.value,
        workflow=f"{r.workflow} v{r.workflow_version}",
        attempt=r.attempt,
        locked_by=r.locked_by,
        owner=r.owner,
        complete_by=r.complete_by.isoformat() if r.complete_by else None,
        next_attempt_at=r.next_attempt_at.isoformat(),
        failure_count=r.failure_count,
        failure_threshold=supervisor.failure_threshold,
        retry_budget=RetryBudget(
            limit=r.retry_budget.limit, used=r.retry_budget.used, remaining=r.retry_budget.remaining
        ),
        reply_to=r.reply_to,
        error=None
        if error is None
        else ErrorAt(kind=error.kind.value, message=error.message, at=error.at.isoformat()),
        created_at=r.created_at.isoformat(),
        updated_at=r.updated_at.isoformat(),
        steps=step_rows(r),
        next=next_action(r, supervisor, now),
    )


async def order_timeline(
    store: StateStore, order_id: str, *, hub: str, retention: RetentionSettings
) -> list[TimelineEvent]:
    """The order's history events, oldest first, each with the time since the first and since
    the one before; NotFound when there are none (an expired journal says so)."""
    events, state = await store.read_history(order_id), await store.get_state(order_id)
    if not events:
        if state is not None and state.process_state.is_terminal:
            raise NotFound(
                f"order {order_id} finished ({state.process_state.value} at "
                f"{state.updated_at.isoformat()}); its history has expired "
                f"(retention {retention.retention_s:g} s)"
            )
        raise NotFound(f"no history for order {order_id} in hub {hub}{purged_note(retention)}")
    start = previous = events[0].at
    rows: list[TimelineEvent] = []
    for e in events:
        rows.append(
            TimelineEvent(
                at=e.at.isoformat(),
                since_start_s=(e.at - start).total_seconds(),
                since_previous_s=(e.at - previous).total_seconds(),
                event=e.type.value,
                attempt=e.attempt,
                instance_id=e.instance_id,
                step=e.step,
                data=e.data,
            )
        )
        previous = e.at
    return rows


def purged_note(retention: RetentionSettings) -> str:
    """What an operator looking for a missing order should know: finished orders go."""
    kept = retention.order_retention_s
    span = f"{kept / 86_400:g} days" if kept >= 86_400 else f"{kept:g} s"
    return (
        f" (a finished order, Processed, Compensated or Cancelled, is deleted {span} after it "
        "finished: ORDERFLOW_ORDER_RETENTION_S)"
    )
