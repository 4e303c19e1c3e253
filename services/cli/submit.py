"""`orderflow submit`: publish orders the way a front end does, and optionally follow them.

The flags that state one order are read here; the orders themselves, and their publishing, are
the shop's (`services/shop/`).
"""

from __future__ import annotations

import asyncio
import random
import sys
from pathlib import Path
from typing import Any

import click
from pydantic import ValidationError

from services.cli.render import echo_json, plain
from services.cli.settings import pass_settings
from services.shop.orders import generated_order, orders_from_file
from services.shop.publish import submit_orders
from shared.config import Settings
from shared.domain.messages import OrderStatus, validation_problems
from shared.domain.models import OrderData
from shared.errors import ConfigurationError

# The flags that state one order, each with the field of `OrderData` it sets (`--line` replaces
# every line; a flag not given keeps the generated value).
ORDER_FIELDS: dict[str, tuple[str, ...]] = {
    "order_id": ("order_id",),
    "customer_id": ("customer_id",),
    "line": ("lines",),
    "currency": ("currency",),
    "payment_token": ("payment_token",),
    "ship_name": ("shipping_address", "name"),
    "ship_line1": ("shipping_address", "line1"),
    "ship_city": ("shipping_address", "city"),
    "ship_postal_code": ("shipping_address", "postal_code"),
    "ship_country": ("shipping_address", "country"),
}
LINE_FORMAT = "SKU:QTY:UNIT_PRICE_CENTS"


def flag_of(name: str) -> str:
    return "--" + name.replace("_", "-")


def line_of(text: str) -> dict[str, Any]:
    """`SKU:QTY:UNIT_PRICE_CENTS` as the fields of an order line; the model checks the limits."""
    try:
        sku, quantity, price = text.split(":")
        return {"sku": sku, "quantity": int(quantity), "unit_price_cents": int(price)}
    except ValueError:
        raise ConfigurationError(
            f"--line {text!r}: expected {LINE_FORMAT} with whole numbers, e.g. sku-1:2:1250"
        ) from None


def order_from_flags(rng: random.Random, flags: dict[str, Any]) -> OrderData:
    """A generated order with each flag given in place of the field it sets, checked by the
    same model as every submitted order."""
    try:
        fields = generated_order(rng, flags.get("order_id")).model_dump()
        for name, (*parents, key) in ORDER_FIELDS.items():
            value = flags.get(name)
            if value is None or value == ():
                continue
            target = fields[parents[0]] if parents else fields
            target[key] = [line_of(text) for text in value] if name == "line" else value
        return OrderData.model_validate(fields)
    except ValidationError as exc:
        raise flag_error(exc, flags) from None


def flag_error(exc: ValidationError, flags: dict[str, Any]) -> ConfigurationError:
    """The first error as one line that names the flag and the value given (never the token)."""
    loc, msg = validation_problems(exc)[0]
    name = next((n for n, path in ORDER_FIELDS.items() if loc[: len(path)] == path), None)
    if name is None:  # not a flag's field: generated values always pass
        return ConfigurationError(f"{'.'.join(str(p) for p in loc)}: {msg}")
    value: Any = flags.get(name)
    rest = loc[len(ORDER_FIELDS[name]) :]
    if name == "line" and rest and isinstance(rest[0], int):
        value, rest = value[rest[0]], rest[1:]
    shown = f" {value!r}" if isinstance(value, str) and name != "payment_token" else ""
    field = "".join(f"{part}: " for part in rest)
    return ConfigurationError(f"{flag_of(name)}{shown}: {field}{msg}")


def orders_to_submit(
    file_: Path | None, count: int | None, seed: int | None, flags: dict[str, Any]
) -> list[OrderData]:
    """The orders the options ask for: from a file, `count` generated, or one from flags."""
    given = [name for name in ORDER_FIELDS if flags.get(name) not in (None, ())]
    stated = [name for name in given if name != "order_id"]
    if file_ is not None and (count or given):
        raise click.UsageError("--file excludes --count and the flags of one order")
    if count and stated:
        raise click.UsageError(f"{flag_of(stated[0])} states one order: drop --count")
    if count and count > 1 and given:
        raise click.UsageError("--order-id names one order; drop it or use --count 1")
    if file_ is not None:
        return orders_from_file(file_)
    rng = random.Random(seed)
    if count and count > 1:
        return [generated_order(rng) for _ in range(count)]
    return [order_from_flags(rng, flags)]


def order_options(command: Any) -> Any:
    """The flags that state one order (a generated value for each one not given)."""
    options = [
        click.option("--order-id", help="Id of the order (default: random)."),
        click.option("--customer-id", help="The customer's id, 1-64 characters."),
        click.option(
            "--line",
            multiple=True,
            metavar=LINE_FORMAT,
            help="An order line, the price in the currency's minor unit, e.g. sku-1:2:1250 "
            "(2 at 12.50); repeat it for more lines (1-100).",
        ),
        click.option("--currency", help="ISO 4217 code in capitals, e.g. EUR."),
        click.option(
            "--payment-token", help="The payment provider's token, tok_... (never card data)."
        ),
        click.option("--ship-name", help="Shipping address: the recipient's name."),
        click.option("--ship-line1", help="Shipping address: street and number."),
        click.option("--ship-city", help="Shipping address: city."),
        click.option("--ship-postal-code", help="Shipping address: postal code."),
        click.option("--ship-country", help="Shipping address: ISO 3166 code, e.g. DE."),
    ]
    for option in reversed(options):
        command = option(command)
    return command


@click.command()
@click.option(
    "--file",
    "file_",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Orders as one JSON object, a JSON array, or JSON lines.",
)
@click.option("--count", type=click.IntRange(min=1), help="Generate this many orders.")
@click.option("--seed", type=int, help="Seed of the generated orders, for repeatable runs.")
@order_options
@click.option("--wait/--no-wait", default=False, help="Follow status messages until final.")
@click.option("--timeout", default=120.0, show_default=True, help="Seconds --wait waits.")
@click.option("--concurrency", default=200, show_default=True, help="Publishes awaiting confirms.")
@click.option(
    "--app",
    help="Application name, the prefix of its status queue for --wait "
    "[default: the user in ORDERFLOW_RABBITMQ_URL].",
)
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@pass_settings()
def submit(
    settings: Settings,
    /,
    file_: Path | None,
    count: int | None,
    seed: int | None,
    wait: bool,
    timeout: float,
    concurrency: int,
    app: str | None,
    as_json: bool,
    **order_flags: Any,
) -> None:
    """Publish orders to <hub>.orders (through <hub>.submit) with confirms: one generated
    order by default, --count generated ones, the orders in --file, or one order stated by
    flags (--customer-id, --line, --currency, --payment-token, --ship-...; a generated value
    for each one not given), e.g.

    \b
      orderflow submit --order-id o-1 --customer-id c-42 --line sku-1:2:1250 \\
        --line sku-2:1:499 --currency EUR --payment-token tok_visa_4242 \\
        --ship-name "Ada Lovelace" --ship-line1 "12 St James's Sq" --ship-city London \\
        --ship-postal-code "SW1Y 4JH" --ship-country GB --wait

    A flag value the order model refuses exits 2 with one line on stderr. Exit code 1 when a
    publish was refused (e.g. the orders queue is full) or, with --wait, when an order failed
    or did not finish in time.
    """
    orders = orders_to_submit(file_, count, seed, order_flags)
    tell = (lambda _: None) if as_json else (lambda line: click.echo(plain(line)))
    result = asyncio.run(
        submit_orders(
            settings,
            orders,
            wait=wait,
            timeout=timeout,
            concurrency=concurrency,
            tell=tell,
            app=app,
        )
    )
    # Scripts get every id; people get them only when there are few.
    ids = [o.order_id for o in orders]
    result["order_ids"] = ids if as_json or len(ids) <= 10 else None
    _print_summary(result, as_json=as_json)
    bad = result["rejected"] or result["failed"] or result["timed_out"]
    if bad or (wait and result["final"].get(OrderStatus.FAILED.value)):
        sys.exit(1)


def _print_summary(result: dict[str, Any], *, as_json: bool) -> None:
    if as_json:
        echo_json(result)
        return
    click.echo(f"published {result['published']} order(s)")
    if result["rejected"]:
        click.echo(
            f"orderflow: error: {len(result['rejected'])} order(s) refused by the broker "
            "(orders queue full): resubmit them later",
            err=True,
        )
    if result["failed"]:
        click.echo(f"orderflow: error: {len(result['failed'])} publish(es) unconfirmed", err=True)
    if result["final"]:
        click.echo(", ".join(f"{k}: {v}" for k, v in sorted(result["final"].items())))
    if result["timed_out"]:
        click.echo(
            f"orderflow: error: {len(result['timed_out'])} order(s) not final in time", err=True
        )
