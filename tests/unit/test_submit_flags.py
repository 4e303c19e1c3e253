"""`orderflow submit`'s flags that state one order: parsed, checked by the order model, and
reported as one line naming the flag."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import click
import pytest

from services.cli.submit import line_of, order_from_flags, orders_to_submit
from services.shop.orders import generated_order
from shared.domain.models import Address, OrderData, OrderLine
from shared.errors import ConfigurationError

EVERY_FLAG = {
    "order_id": "o-flags",
    "customer_id": "cust-7",
    "line": ("sku-a:2:1250", "sku-b:1:0"),
    "currency": "USD",
    "payment_token": "tok_flags_1",
    "ship_name": "Grace Hopper",
    "ship_line1": "1 Navy Way",
    "ship_city": "Arlington",
    "ship_postal_code": "22202",
    "ship_country": "US",
}


def test_every_flag_states_the_whole_order() -> None:
    assert order_from_flags(random.Random(1), EVERY_FLAG) == OrderData(
        order_id="o-flags",
        customer_id="cust-7",
        lines=[
            OrderLine(sku="sku-a", quantity=2, unit_price_cents=1250),
            OrderLine(sku="sku-b", quantity=1, unit_price_cents=0),
        ],
        currency="USD",
        payment_token="tok_flags_1",
        shipping_address=Address(
            name="Grace Hopper",
            line1="1 Navy Way",
            city="Arlington",
            postal_code="22202",
            country="US",
        ),
    )


def test_a_flag_not_given_keeps_the_generated_value() -> None:
    given = order_from_flags(random.Random(3), {"currency": "USD", "ship_city": "Paris"})
    generated = generated_order(random.Random(3))
    assert given.currency == "USD"
    assert given.shipping_address.city == "Paris"
    assert (
        given.model_copy(update={"currency": "EUR", "shipping_address": generated.shipping_address})
        == generated
    )


@pytest.mark.parametrize("order_id", [None, "o-7"])
def test_without_other_flags_the_order_is_the_generated_one_as_before(order_id: str | None) -> None:
    flags = {name: None for name in EVERY_FLAG} | {"line": (), "order_id": order_id}
    assert order_from_flags(random.Random(5), flags) == generated_order(random.Random(5), order_id)


@pytest.mark.parametrize(
    ("text", "fields"),
    [
        ("sku-1:2:1250", {"sku": "sku-1", "quantity": 2, "unit_price_cents": 1250}),
        ("A.b_c:10000:0", {"sku": "A.b_c", "quantity": 10000, "unit_price_cents": 0}),
    ],
)
def test_a_line_is_sku_quantity_and_unit_price_in_minor_units(
    text: str, fields: dict[str, Any]
) -> None:
    assert line_of(text) == fields


@pytest.mark.parametrize("text", ["sku-1", "sku-1:2", "sku-1:2:3:4", "sku-1:two:100", "s:1:1.5"])
def test_a_line_that_is_not_three_fields_with_whole_numbers_is_refused(text: str) -> None:
    with pytest.raises(ConfigurationError, match="expected SKU:QTY:UNIT_PRICE_CENTS") as caught:
        line_of(text)
    assert str(caught.value).startswith(f"--line {text!r}: ")


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        ({"line": ("sku-1:1:1", "sku-2:0:100")}, "--line 'sku-2:0:100': quantity: Input should be"),
        ({"line": ("bad*sku:1:1",)}, "--line 'bad*sku:1:1': sku: String should match"),
        ({"line": ("s:1:1",) * 101}, "--line: List should have at most 100 items"),
        ({"currency": "eur"}, "--currency 'eur': String should match"),
        ({"order_id": "a:b"}, "--order-id 'a:b': String should match"),
        ({"customer_id": ""}, "--customer-id '': String should have at least 1 character"),
        ({"ship_country": "Germany"}, "--ship-country 'Germany': String should match"),
        ({"ship_postal_code": "1" * 21}, "--ship-postal-code '111111111111111111111': String"),
        ({"payment_token": "4242424242424242"}, "--payment-token: String should match"),
    ],
    ids=[
        "quantity",
        "sku",
        "too-many-lines",
        "currency",
        "order-id",
        "customer",
        "country",
        "postal-code",
        "token",
    ],
)
def test_a_value_the_model_refuses_is_one_line_naming_the_flag(
    flags: dict[str, Any], says: str
) -> None:
    with pytest.raises(ConfigurationError) as caught:
        order_from_flags(random.Random(1), flags)
    message = str(caught.value)
    assert message.startswith(says)
    assert "\n" not in message
    assert "4242424242424242" not in message, "what was given as a token is never echoed"


@pytest.mark.parametrize(
    ("count", "file_", "flags", "says"),
    [
        (None, Path("orders.json"), {"line": ("s:1:1",)}, "--file excludes"),
        (None, Path("orders.json"), {"order_id": "o-1"}, "--file excludes"),
        (1, Path("orders.json"), {}, "--file excludes"),
        (1, None, {"currency": "EUR"}, "--currency states one order: drop --count"),
        (5, None, {"line": ("s:1:1",)}, "--line states one order: drop --count"),
        (2, None, {"order_id": "o-1"}, "--order-id names one order"),
    ],
)
def test_flags_of_one_order_with_count_or_file_are_a_usage_error(
    count: int | None, file_: Path | None, flags: dict[str, Any], says: str
) -> None:
    with pytest.raises(click.UsageError, match=says):
        orders_to_submit(file_, count, None, flags)


def test_count_generates_orders_and_order_id_still_names_the_only_one() -> None:
    assert len(orders_to_submit(None, 3, 1, {})) == 3
    assert orders_to_submit(None, 3, 1, {}) == orders_to_submit(None, 3, 1, {"line": ()})
    [one] = orders_to_submit(None, 1, 1, {"order_id": "o-1"})
    assert one == generated_order(random.Random(1), "o-1")
