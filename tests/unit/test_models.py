from __future__ import annotations

import pytest
from pydantic import ValidationError

from shared.domain.models import OrderLine, RetryBudget, StateRecord
from tests.support.factories import order_data, order_pair


def test_fingerprint_depends_on_the_data_only() -> None:
    a = order_data("o-1")
    assert a.fingerprint() == order_data("o-1").fingerprint()
    assert a.fingerprint() != order_data("o-1", currency="USD").fingerprint()
    assert a.total_cents == 2500


@pytest.mark.parametrize(
    "override",
    [
        {"order_id": "has:colon"},
        {"order_id": ""},
        {"order_id": "x" * 65},
        {"currency": "eur"},
        {"payment_token": "4242424242424242"},
        {"lines": []},
        {"lines": [OrderLine(sku="s", quantity=1, unit_price_cents=1)] * 101},
        {"customer_id": "c" * 65},
    ],
    ids=[
        "colon",
        "empty-id",
        "long-id",
        "currency",
        "card-number",
        "no-lines",
        "too-many-lines",
        "long-customer",
    ],
)
def test_order_data_refuses_what_breaks_its_limits(override: dict) -> None:
    with pytest.raises(ValidationError):
        order_data(**override)


def test_order_data_is_strict() -> None:
    with pytest.raises(ValidationError):
        OrderLine(sku="s", quantity="2", unit_price_cents=1)  # type: ignore[arg-type]
    with pytest.raises(ValidationError):
        OrderLine(sku="s", quantity=0, unit_price_cents=1)


def test_retry_budget_spends_and_exhausts() -> None:
    budget = RetryBudget(limit=3)
    assert (budget.remaining, budget.exhausted) == (3, False)
    spent = budget.spend(3)
    assert (spent.remaining, spent.exhausted) == (0, True)
    assert budget.used == 0
    with pytest.raises(ValueError):
        budget.spend(-1)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("locked_by", "o-1:" + "9" * 130),
        ("owner", "s" * 201),
        ("workflow", ""),
        ("workflow", "w" * 65),
        ("reply_to", "q" * 256),
    ],
)
def test_state_records_refuse_what_breaks_their_limits(field: str, value: str) -> None:
    _, state = order_pair("o-1")
    StateRecord.model_validate(state.model_dump())  # the record as written is fine
    with pytest.raises(ValidationError):
        StateRecord.model_validate(state.model_dump() | {field: value})
