"""Orders as a shop makes them: generated ones (for `submit`, the benchmark and tests), orders
read from a file, and the message id that makes a re-publish of the same order a duplicate."""

from __future__ import annotations

import json
import random
import uuid
from pathlib import Path

from pydantic import ValidationError

from shared.domain.messages import validation_problems
from shared.domain.models import Address, OrderData, OrderLine
from shared.errors import ConfigurationError


def generated_order(rng: random.Random, order_id: str | None = None) -> OrderData:
    lines = [
        OrderLine(
            sku=f"sku-{rng.randrange(1000):03d}",
            quantity=rng.randint(1, 5),
            unit_price_cents=rng.randint(100, 20_000),
        )
        for _ in range(rng.randint(1, 3))
    ]
    return OrderData(
        order_id=order_id or f"ord-{uuid.UUID(int=rng.getrandbits(128)).hex[:20]}",
        customer_id=f"cust-{rng.randrange(10_000)}",
        lines=lines,
        currency="EUR",
        payment_token=f"tok_{uuid.UUID(int=rng.getrandbits(128)).hex[:24]}",
        shipping_address=Address(
            name="A. Customer",
            line1="1 Main Street",
            city="Springfield",
            postal_code="12345",
            country="DE",
        ),
    )


def orders_from_file(path: Path) -> list[OrderData]:
    """One JSON object, a JSON array of them, or JSON lines."""
    text = path.read_text()
    try:
        loaded = json.loads(text)
        items = loaded if isinstance(loaded, list) else [loaded]
    except json.JSONDecodeError:
        try:
            items = [json.loads(line) for line in text.splitlines() if line.strip()]
        except json.JSONDecodeError as exc:
            raise ConfigurationError(f"{path}: not JSON or JSON lines: {exc}") from None
    orders = []
    for n, item in enumerate(items, start=1):
        try:
            orders.append(OrderData.model_validate_json(json.dumps(item)))
        except ValidationError as exc:
            loc, msg = validation_problems(exc)[0]
            where = ".".join(str(p) for p in loc)
            raise ConfigurationError(f"{path}: order {n}: {where}: {msg}") from None
    return orders


def message_id_of(order: OrderData) -> str:
    """Stable for the same order data: a re-publish is deduplicated, a changed order is not."""
    return f"order:{order.order_id}:{order.fingerprint()[:16]}"
