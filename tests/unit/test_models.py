from __future__ import annotations

import pytest
from pydantic import ValidationError

from shared.domain.models import OrderLine, RetryBudget
from tests.support.factories import order_data


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
