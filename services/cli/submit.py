"""`orderflow submit`: publish orders the way a front end does, and optionally follow them."""

from __future__ import annotations

import asyncio
import json
import random
import sys
import uuid
from collections import Counter
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import click
from aio_pika.abc import AbstractIncomingMessage
from pydantic import ValidationError

from shared.bootstrap import open_broker
from shared.broker.private import PrivateQueue
from shared.broker.publisher import Publisher
from shared.broker.topology import APP_NAME, Names
from shared.config import Settings
from shared.domain.messages import Contract, OrderStatus, OrderStatusUpdate, SubmitOrder
from shared.domain.models import Address, OrderData, OrderLine
from shared.errors import ConfigurationError, PublishError, PublishRejected

FINAL = {OrderStatus.COMPLETED, OrderStatus.FAILED, OrderStatus.COMPENSATED}


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
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            raise ConfigurationError(f"{path}: order {n}: {where}: {first['msg']}") from None
    return orders


def app_name(settings: Settings, app: str | None) -> str:
    """The submitting application's name, which prefixes its status queues: `--app`, or else
    the user name in ORDERFLOW_RABBITMQ_URL (the RabbitMQ user is the application)."""
    name = app or urlsplit(settings.rabbitmq_url).username or ""
    if not APP_NAME.fullmatch(name):
        raise ConfigurationError(
            f"application name {name!r} (--app, or the user in ORDERFLOW_RABBITMQ_URL) must "
            f"match {APP_NAME.pattern}: it prefixes the application's status queues"
        )
    return name


def message_id_of(order: OrderData) -> str:
    """Stable for the same order data: a re-publish is deduplicated, a changed order is not."""
    return f"order:{order.order_id}:{order.fingerprint()[:16]}"


async def submit_orders(
    settings: Settings,
    orders: list[OrderData],
    *,
    wait: bool,
    timeout: float,
    concurrency: int,
    echo: Any,
    app: str | None = None,
) -> dict[str, Any]:
    names = Names(settings.hub)
    status_queue = names.status_queue(app_name(settings, app)) if wait else None
    connection = await open_broker(settings, name="orderflow-submit")
    statuses: dict[str, OrderStatus] = {}
    finished = asyncio.Event()
    pending_ids = {o.order_id for o in orders}

    def on_status(contract: Contract, message: AbstractIncomingMessage) -> None:
        if not isinstance(contract, OrderStatusUpdate):
            return
        statuses[contract.order_id] = contract.status
        detail = f" ({contract.detail})" if contract.detail else ""
        echo(f"{contract.order_id}: {contract.status.value}{detail}")
        if all(statuses.get(o) in FINAL for o in pending_ids):
            finished.set()

    replies = None
    try:
        if status_queue is not None:
            replies = PrivateQueue(
                connection,
                status_queue,
                on_status,
                max_bytes=settings.max_message_bytes,
            )
            await replies.start()
        publisher = await Publisher.open(
            connection,
            timeout=settings.publish_timeout_s,
            duplicate_rate=settings.fault_duplicate_rate,
            seed=settings.fault_seed,
        )
        outcome = await _publish_all(publisher, names, orders, replies, concurrency)
        for order_id in outcome["rejected"] + outcome["failed"]:
            pending_ids.discard(order_id)
        if wait and pending_ids:
            try:
                await asyncio.wait_for(finished.wait(), timeout=timeout)
            except TimeoutError:
                outcome["timed_out"] = sorted(
                    o for o in pending_ids if statuses.get(o) not in FINAL
                )
        outcome["final"] = dict(Counter(s.value for s in statuses.values() if s in FINAL))
        return outcome
    finally:
        if replies is not None:
            await replies.stop()
        await connection.close()


async def _publish_all(
    publisher: Publisher,
    names: Names,
    orders: list[OrderData],
    replies: PrivateQueue | None,
    concurrency: int,
) -> dict[str, Any]:
    outcome: dict[str, Any] = {"published": 0, "rejected": [], "failed": [], "timed_out": []}
    gate = asyncio.Semaphore(concurrency)

    async def one(order: OrderData) -> None:
        async with gate:
            try:
                await publisher.publish(
                    SubmitOrder(order=order, reply_to=replies.name if replies else None),
                    exchange=names.submit,
                    routing_key=names.orders,
                    message_id=message_id_of(order),
                    correlation_id=order.order_id,
                )
                outcome["published"] += 1
            except PublishRejected:
                outcome["rejected"].append(order.order_id)
            except PublishError:
                outcome["failed"].append(order.order_id)

    await asyncio.gather(*(one(o) for o in orders))
    return outcome


@click.command()
@click.option(
    "--file",
    "file_",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Orders as one JSON object, a JSON array, or JSON lines.",
)
@click.option("--count", type=click.IntRange(min=1), help="Generate this many orders.")
@click.option("--order-id", help="Id of the one generated order (default: random).")
@click.option("--seed", type=int, help="Seed of the generated orders, for repeatable runs.")
@click.option("--wait/--no-wait", default=False, help="Follow status messages until final.")
@click.option("--timeout", default=120.0, show_default=True, help="Seconds --wait waits.")
@click.option("--concurrency", default=200, show_default=True, help="Publishes awaiting confirms.")
@click.option(
    "--app",
    help="Application name, the prefix of its status queue for --wait "
    "[default: the user in ORDERFLOW_RABBITMQ_URL].",
)
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@click.pass_context
def submit(
    ctx: click.Context,
    file_: Path | None,
    count: int | None,
    order_id: str | None,
    seed: int | None,
    wait: bool,
    timeout: float,
    concurrency: int,
    app: str | None,
    as_json: bool,
) -> None:
    """Publish orders to <hub>.orders (through <hub>.submit) with confirms (one generated
    order by default).

    Exit code 1 when a publish was refused (e.g. the orders queue is full) or, with --wait,
    when an order failed or did not finish in time.
    """
    settings: Settings = ctx.find_object(Settings)  # type: ignore[assignment]
    if file_ is not None and (count or order_id):
        raise click.UsageError("--file excludes --count and --order-id")
    if count and order_id and count > 1:
        raise click.UsageError("--order-id names one order; drop it or use --count 1")
    rng = random.Random(seed)
    if file_ is not None:
        orders = orders_from_file(file_)
    else:
        try:
            orders = [generated_order(rng, order_id) for _ in range(count or 1)]
        except ValidationError as exc:
            raise click.BadParameter(exc.errors()[0]["msg"], param_hint="--order-id") from None
    echo = (lambda _: None) if as_json else click.echo
    result = asyncio.run(
        submit_orders(
            settings,
            orders,
            wait=wait,
            timeout=timeout,
            concurrency=concurrency,
            echo=echo,
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
        click.echo(json.dumps(result))
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
