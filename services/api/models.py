"""What the HTTP API takes and answers: the models its OpenAPI document is generated from.

A shop's order is the object `order.submit` carries in `order` (shared/domain/messages.py), with
the shop's own id. What the API answers a shop is the customer's view of its order: a status
in the words a shop shows (`Received`, `Processing`, `Completed`, …), its steps and what happens
next; never the payment token, nor anything of another shop.

Every answer is JSON with no card number in clear (`ShownJSON`, shared/domain/redaction.py): the
routers answer with it, and so do the application's refusals (`refused_input` for a request that
does not validate, which would otherwise echo what was sent).
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, Literal

from fastapi import Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import AwareDatetime, BaseModel, BeforeValidator, ConfigDict, Field

from shared.domain.models import (
    APP_ORDER_ID,
    NOT_A_CARD_NUMBER,
    OrderData,
    OrderRecord,
    StateRecord,
)
from shared.domain.redaction import may_hold_card, redact_shown
from shared.domain.states import ErrorKind, ProcessState, StepStatus
from shared.domain.workflow import get_workflow

SHOP_ORDER_ID = rf"^{APP_ORDER_ID}$"


class ShownJSON(JSONResponse):
    """A JSON answer with every card number in it masked. Rendered as it is when its text
    holds no run of 12 digits (most answers: one quick look), else rendered again masked."""

    def render(self, content: Any) -> bytes:
        body = super().render(content)
        if may_hold_card(body.decode("utf-8", "replace")):
            body = super().render(redact_shown(content))
        return body


async def refused_input(request: Request, exc: Exception) -> JSONResponse:
    """A request that does not validate: 422 with what was wrong where (FastAPI's own answer,
    which quotes each value refused), masked."""
    errors = exc.errors() if isinstance(exc, RequestValidationError) else []
    return ShownJSON({"detail": jsonable_encoder(errors)}, status_code=422)


class ErrorBody(BaseModel):
    """Every refusal: what was wrong, in one sentence."""

    detail: str


class NewOrder(OrderData):
    """An order as a shop places it: `order.submit`'s `order`, with the shop's own id (which
    the API keeps apart from every other shop's)."""

    model_config = ConfigDict(
        strict=True,
        frozen=True,
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "order_id": "o-1001",
                    "customer_id": "cust-42",
                    "lines": [{"sku": "mug-blue", "quantity": 2, "unit_price_cents": 1250}],
                    "currency": "EUR",
                    "payment_token": "tok_visa",
                    "shipping_address": {
                        "name": "A. Customer",
                        "line1": "1 Main Street",
                        "city": "Springfield",
                        "postal_code": "12345",
                        "country": "DE",
                    },
                }
            ]
        },
    )
    order_id: Annotated[str, NOT_A_CARD_NUMBER] = Field(pattern=SHOP_ORDER_ID, max_length=40)
    """The shop's id of the order: 1-40 letters, digits, '.', '_' or '-', starting with a letter
    or digit; the same id with the same data is the same order."""


class CustomerStatus(StrEnum):
    """Where an order stands, as a shop tells its customer."""

    RECEIVED = "Received"
    PROCESSING = "Processing"
    COMPLETED = "Completed"
    FAILED = "Failed"
    COMPENSATING = "Compensating"
    COMPENSATED = "Compensated"
    CANCELLED = "Cancelled"


_STATUS = {
    ProcessState.PENDING: CustomerStatus.RECEIVED,
    ProcessState.PROCESSING: CustomerStatus.PROCESSING,
    ProcessState.PROCESSED: CustomerStatus.COMPLETED,
    ProcessState.ERROR: CustomerStatus.FAILED,
    ProcessState.COMPENSATING: CustomerStatus.COMPENSATING,
    ProcessState.COMPENSATED: CustomerStatus.COMPENSATED,
    ProcessState.COMPENSATION_FAILED: CustomerStatus.FAILED,
    ProcessState.CANCELLED: CustomerStatus.CANCELLED,
}
FINAL = frozenset({CustomerStatus.COMPLETED, CustomerStatus.COMPENSATED, CustomerStatus.CANCELLED})
"""Statuses that never change again (a Failed order waits for an operator)."""

_NEXT = {
    ProcessState.PENDING: "waiting for its turn: its steps start soon",
    ProcessState.PROCESSING: "its steps are running",
    ProcessState.PROCESSED: "nothing: every step is done",
    ProcessState.ERROR: "stopped: an operator is looking at it (it may still be cancelled)",
    ProcessState.COMPENSATING: "what its steps did is being undone, newest first",
    ProcessState.COMPENSATED: "nothing: what its steps did was undone",
    ProcessState.COMPENSATION_FAILED: "an undo failed: an operator is looking at it",
    ProcessState.CANCELLED: "nothing: it was cancelled before any step ran",
}


class StepView(BaseModel):
    name: str
    status: StepStatus
    attempts: int
    started_at: datetime | None = None
    completed_at: datetime | None = None
    error: str | None = None


class LineView(BaseModel):
    sku: str
    quantity: int
    unit_price_cents: int


class ShopOrderView(BaseModel):
    """A shop's order as its customer may see it."""

    order_id: str
    """The shop's own id."""
    status: CustomerStatus
    process_state: ProcessState
    steps: list[StepView]
    next: str
    """What happens next, in a sentence."""
    cancellable: bool
    """Whether `POST /orders/{order_id}/cancel` would cancel it now."""
    error: str | None = None
    lines: list[LineView]
    total_cents: int
    currency: str
    created_at: datetime
    updated_at: datetime


class PlacedOrder(BaseModel):
    """The answer to `POST /orders`."""

    order_id: str
    recorded: bool
    """False: the broker took it, and it was not recorded yet (202): follow it."""
    order: ShopOrderView | None = None


class CancelResult(BaseModel):
    order_id: str
    outcome: ProcessState
    """Cancelled (nothing had run), or Compensating (what ran is being undone)."""
    order: ShopOrderView


class CatalogueItem(BaseModel):
    sku: str = Field(pattern=r"^[A-Za-z0-9._-]{1,64}$")
    name: str = Field(min_length=1, max_length=200)
    unit_price_cents: int = Field(ge=0, le=100_000_000)


class Catalogue(BaseModel):
    currency: str
    items: list[CatalogueItem]
    test_payment_tokens: dict[str, str]
    """Payment tokens a test checkout may use, and what each does."""


def shop_view(shop_id: str, order: OrderRecord, record: StateRecord) -> ShopOrderView:
    """The customer's view of a recorded order."""
    data = order.data
    from shared.domain.cancellation import refusal  # noqa: PLC0415 - a leaf import

    workflow = get_workflow(record.workflow, record.workflow_version)
    names = [s.name for s in workflow.steps] if workflow is not None else sorted(record.steps)
    steps = [
        StepView(
            name=name,
            status=state.status,
            attempts=state.attempts,
            started_at=state.started_at,
            completed_at=state.completed_at,
            error=state.error.message if state.error is not None else None,
        )
        for name in names
        if (state := record.steps.get(name)) is not None
    ]
    return ShopOrderView(
        order_id=shop_id,
        status=_STATUS[record.process_state],
        process_state=record.process_state,
        steps=steps,
        next=_NEXT[record.process_state],
        cancellable=refusal(record) is None,
        error=record.error.message if record.error is not None else None,
        lines=[LineView(**line.model_dump()) for line in data.lines],
        total_cents=data.total_cents,
        currency=data.currency,
        created_at=record.created_at,
        updated_at=record.updated_at,
    )


# -- the operator endpoints (services/api/operations.py)

SYSTEM_ORDER_ID = rf"^([a-z][a-z0-9_-]{{0,39}}/)?{APP_ORDER_ID}$"
"""An order's id as the store holds it: the application's id, prefixed with its shop's name when
a shop placed it."""


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


InputQueue = Literal["orders", "inventory", "payment", "shipping"]


class Replay(Body):
    message_ids: list[Annotated[str, Field(min_length=1, max_length=300)]] | None = Field(
        default=None, max_length=10_000
    )
    """These dead letters (none given: every one of the queue)."""
    queue: InputQueue | None = None
