"""The shop's endpoints: place an order, read it, follow it live, cancel it.

A shop sees only the orders it placed: the API submits each under the shop's name
(`<shop>.<id>`), and looks an order up only under the asking shop's name, so another shop's
order with the same id is not found (404), never shown.

`POST /orders` is idempotent by the shop's id: the same data again is the same order (200);
other data under an id already recorded is a 409 and changes nothing. A new order is published
to `<hub>.submit` with a publisher confirm, as every application does, and the API waits (up to
`ORDERFLOW_API_RECORD_WAIT_S`) for submission to record it: 201 once recorded, 409 if what was
recorded under its id meanwhile is another order, 202 if it is not recorded yet (the broker has
it; nothing accepted is lost). A full backlog is a 503 with `Retry-After`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable
from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Path, Request, Response
from fastapi.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from services.api.auth import Anyone, Shop, context
from services.api.context import ApiContext
from services.api.models import (
    FINAL,
    SHOP_ORDER_ID,
    CancelResult,
    Catalogue,
    CustomerStatus,
    ErrorBody,
    NewOrder,
    PlacedOrder,
    ShopOrderView,
    ShownJSON,
    shop_view,
)
from services.shop.orders import message_id_of
from shared.domain.messages import SubmitOrder
from shared.domain.models import OrderData, OrderRecord, StateRecord
from shared.domain.redaction import redact_shown
from shared.errors import PublishError, PublishRejected

router = APIRouter(tags=["shop"], default_response_class=ShownJSON)

Context = Annotated[ApiContext, Depends(context)]
ShopOrderId = Annotated[
    str, Path(pattern=SHOP_ORDER_ID, max_length=40, description="The shop's id of the order.")
]
KEEP_ALIVE_S = 15.0
"""A stream with nothing to say sends a comment this often (proxies close silent streams)."""
RECONNECT_MS = 1000
"""SSE's `retry:`: how long a client waits before it opens a stream the API ended again."""
RESTING = FINAL | {CustomerStatus.FAILED}
"""Where a stream ends: the order is final, or Failed, waiting for an operator (for days, maybe;
a stream kept open meanwhile read the store every `api_stream_poll_s`). Once an operator moves
it again, a new stream follows it."""

ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorBody, "description": "No token, or an unknown or revoked one."},
    403: {"model": ErrorBody, "description": "The token's role may not do this."},
    503: {"model": ErrorBody, "description": "A server orderflow needs is unavailable."},
}
NOT_FOUND: dict[int | str, dict[str, Any]] = {
    404: {"model": ErrorBody, "description": "This shop has no order with this id."}
}


async def _find(ctx: ApiContext, app_order_id: str) -> tuple[OrderRecord, StateRecord] | None:
    """The order the API submitted under this id, and its state record (None: not recorded)."""
    ids = ctx.stored_ids(app_order_id)
    for order in await ctx.store.get_orders(ids):
        if order is not None:
            state = await ctx.store.get_state(order.order_id)
            if state is not None:
                return order, state
    return None


def _same(order: OrderRecord, data: OrderData) -> bool:
    """Whether the recorded order holds this data (under the id it was recorded with)."""
    return order.fingerprint == data.model_copy(update={"order_id": order.order_id}).fingerprint()


def _conflict(shop_order_id: str) -> HTTPException:
    return HTTPException(409, f"order {shop_order_id} exists with other data; nothing was changed")


@router.get("/catalogue", response_model=Catalogue, responses=ERRORS)
async def catalogue(ctx: Context, who: Anyone) -> Catalogue:
    """What the shop sells, and the test payment tokens a checkout may use."""
    return ctx.catalogue


@router.post(
    "/orders",
    response_model=PlacedOrder,
    status_code=201,
    responses={
        **ERRORS,
        200: {"model": PlacedOrder, "description": "The same order again: nothing new."},
        202: {"model": PlacedOrder, "description": "Taken by the broker, not recorded yet."},
        409: {"model": ErrorBody, "description": "Another order holds this id."},
    },
)
async def place_order(
    order: NewOrder, ctx: Context, shop: Shop, request: Request, response: Response
) -> PlacedOrder:
    """Place an order: `order.submit`'s `order`, with the shop's own id."""
    app_id = ctx.app_order_id(shop.name, order.order_id)
    data = OrderData.model_validate({**order.model_dump(), "order_id": app_id})
    found = await _find(ctx, app_id)
    if found is not None:
        if not _same(found[0], data):
            raise _conflict(order.order_id)
        response.status_code = 200
        return PlacedOrder(
            order_id=order.order_id, recorded=True, order=shop_view(order.order_id, *found)
        )
    with ctx.bridge.watch(app_id) as woken:
        await _publish(ctx, data)
        found = await _recorded(ctx, app_id, woken)
    if found is None:
        response.status_code = 202
        return PlacedOrder(order_id=order.order_id, recorded=False)
    if not _same(found[0], data):
        raise _conflict(order.order_id)
    response.headers["Location"] = f"/orders/{order.order_id}"
    return PlacedOrder(
        order_id=order.order_id, recorded=True, order=shop_view(order.order_id, *found)
    )


async def _publish(ctx: ApiContext, data: OrderData) -> None:
    try:
        await ctx.publisher.publish(
            SubmitOrder(order=data, reply_to=ctx.status_queue),
            exchange=ctx.names.submit,
            routing_key=ctx.names.orders,
            message_id=message_id_of(data),
            correlation_id=data.order_id,
        )
    except PublishRejected:
        raise HTTPException(
            503,
            "orderflow is at its order backlog limit: place the order again shortly",
            headers={"Retry-After": "5"},
        ) from None
    except PublishError as exc:
        raise HTTPException(
            503, f"the broker did not take the order ({exc}); place it again shortly"
        ) from None


async def _recorded(
    ctx: ApiContext, app_id: str, woken: asyncio.Event
) -> tuple[OrderRecord, StateRecord] | None:
    """The order once submission recorded it (its Received status wakes this), or None when
    `api_record_wait_s` passed first."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + ctx.settings.api_record_wait_s
    while True:
        found = await _find(ctx, app_id)
        left = deadline - loop.time()
        if found is not None or left <= 0:
            return found
        # A lost status costs a look every quarter second, never a missed order.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(woken.wait(), timeout=min(left, 0.25))
        woken.clear()


async def _view(ctx: ApiContext, shop: str, shop_order_id: str) -> ShopOrderView:
    found = await _find(ctx, ctx.app_order_id(shop, shop_order_id))
    if found is None:
        raise HTTPException(404, f"no order {shop_order_id} of shop {shop}")
    return shop_view(shop_order_id, *found)


@router.get("/orders/{order_id}", response_model=ShopOrderView, responses={**ERRORS, **NOT_FOUND})
async def get_order(order_id: ShopOrderId, ctx: Context, shop: Shop) -> ShopOrderView:
    """One of the shop's orders: its status, its steps and what happens next."""
    return await _view(ctx, shop.name, order_id)


class EventStream(StreamingResponse):
    """Server-sent events that give their place among the API's streams back however they end:
    the order stopped, the stream's time is up, or the client left."""

    def __init__(self, content: AsyncIterator[str], give_back: Callable[[], None]) -> None:
        super().__init__(
            content,
            media_type="text/event-stream",
            headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
        )
        self._give_back = give_back

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._give_back()


@router.get(
    "/orders/{order_id}/events",
    response_class=StreamingResponse,
    responses={
        **ERRORS,
        **NOT_FOUND,
        200: {
            "description": "Server-sent events: an `order` event with the order as "
            "`GET /orders/{order_id}` answers, at once and on every change, until it is "
            "Completed, Compensated, Cancelled or Failed, or the stream's time is up "
            "(`ORDERFLOW_API_STREAM_MAX_S`): then open it again.",
            "content": {"text/event-stream": {"schema": {"type": "string"}}},
        },
    },
)
async def order_events(
    order_id: ShopOrderId, ctx: Context, shop: Shop, request: Request
) -> StreamingResponse:
    """Follow one of the shop's orders live (server-sent events)."""
    first = await _view(ctx, shop.name, order_id)  # a 404 before the stream starts
    give_back = ctx.streams.take(shop.name)  # a 429 or a 503 before it starts
    app_id = ctx.app_order_id(shop.name, order_id)
    return EventStream(_events(ctx, shop.name, order_id, app_id, first, request), give_back)


async def _events(
    ctx: ApiContext,
    shop: str,
    order_id: str,
    app_id: str,
    view: ShopOrderView,
    request: Request,
) -> AsyncIterator[str]:
    """The order now, then again whenever a status message about it arrives or a look every
    `api_stream_poll_s` finds it changed; ends once it rests, or after `api_stream_max_s`."""
    poll = ctx.settings.api_stream_poll_s
    loop = asyncio.get_running_loop()
    ends_at = loop.time() + ctx.settings.api_stream_max_s
    yield f"retry: {RECONNECT_MS}\n\n"
    with ctx.bridge.watch(app_id) as woken:
        last: ShopOrderView | None = None
        quiet = 0.0
        while True:
            if view != last:
                # Masked as every answer of the API is (`ShownJSON`): a stream is one too.
                shown = redact_shown(view.model_dump(mode="json"))
                yield f"event: order\ndata: {json.dumps(shown)}\n\n"
                last, quiet = view, 0.0
            elif quiet >= KEEP_ALIVE_S:
                yield ": still following\n\n"
                quiet = 0.0
            left = ends_at - loop.time()
            if view.status in RESTING or left <= 0 or await request.is_disconnected():
                return
            try:
                await asyncio.wait_for(woken.wait(), timeout=min(poll, left))
            except TimeoutError:
                quiet += min(poll, left)
            woken.clear()
            view = await _view(ctx, shop, order_id)


@router.post(
    "/orders/{order_id}/cancel",
    response_model=CancelResult,
    responses={
        **ERRORS,
        **NOT_FOUND,
        409: {"model": ErrorBody, "description": "It cannot be cancelled now; why."},
    },
)
async def cancel(order_id: ShopOrderId, ctx: Context, shop: Shop) -> CancelResult:
    """Cancel one of the shop's orders: at once if none of its steps ran, else what ran is
    undone (it ends Compensated); a finished order refuses, with the reason (409)."""
    app_id = ctx.app_order_id(shop.name, order_id)
    found = await _find(ctx, app_id)
    if found is None:
        raise HTTPException(404, f"no order {order_id} of shop {shop.name}")
    # Its application (the API, for its shops) is told on the order's status queue, as by
    # every other way to cancel, through the API's own publisher.
    outcome = await ctx.ops.cancel(found[0].order_id, by=shop.name)
    if outcome.refused is not None or outcome.after is None:
        raise HTTPException(409, outcome.refused or "not cancelled")
    ctx.bridge.notify(app_id)  # its streams show it at once
    return CancelResult(
        order_id=order_id, outcome=outcome.after, order=await _view(ctx, shop.name, order_id)
    )
