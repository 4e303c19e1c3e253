"""Building orders and state records for tests."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from typing import Any

from shared.domain.journal import CompensationEntry
from shared.domain.models import Address, OrderData, OrderLine, OrderRecord, StateRecord
from shared.domain.timing import utcnow
from shared.domain.workflow import ORDER_WORKFLOW, new_state_record


def order_data(order_id: str | None = None, **overrides: Any) -> OrderData:
    fields: dict[str, Any] = {
        "order_id": order_id if order_id is not None else f"o-{uuid.uuid4().hex[:16]}",
        "customer_id": "c-42",
        "lines": [OrderLine(sku="sku-1", quantity=2, unit_price_cents=1250)],
        "currency": "EUR",
        "payment_token": "tok_visa_4242",
        "shipping_address": Address(
            name="Ada Lovelace",
            line1="12 St James's Sq",
            city="London",
            postal_code="SW1Y 4JH",
            country="GB",
        ),
    }
    fields.update(overrides)
    return OrderData(**fields)


def order_pair(
    order_id: str | None = None,
    *,
    now: datetime | None = None,
    due_in: timedelta = timedelta(0),
    retry_budget: int = 10,
    reply_to: str | None = None,
    **overrides: Any,
) -> tuple[OrderRecord, StateRecord]:
    now = now or utcnow()
    data = order_data(order_id, **overrides)
    order = OrderRecord.of(data, now)
    state = new_state_record(
        order, ORDER_WORKFLOW, now=now, retry_budget=retry_budget, reply_to=reply_to
    )
    return order, state.model_copy(update={"next_attempt_at": now + due_in})


UNDOS = {"reserve": "inventory.release", "charge": "payment.refund", "ship": "shipping.cancel"}
"""The undo of each step of the order workflow."""


def undo_entry(order_id: str, step: str, *, at: datetime, **overrides: Any) -> CompensationEntry:
    """A compensation-log entry of `step`, as the scheduler logs it when the step starts."""
    return CompensationEntry(
        order_id=order_id,
        step=step,
        undo=UNDOS[step],
        idempotency_key=f"{order_id}:{step}:undo",
        recorded_at=at,
        **overrides,
    )
