"""How a command runs an operator action: `run_operations` opens the operations for the run
(services/operator/operations.py: the store, and the broker when asked), calls the action the
API calls too, and closes them."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

from services.operator.operations import Operations, open_operations
from shared.config import Settings

T = TypeVar("T")


def run_operations(
    settings: Settings,
    action: Callable[[Operations], Awaitable[T]],
    *,
    name: str = "orderflow",
    store: bool = True,
    broker: bool = False,
    publisher: bool = False,
) -> T:
    """`action` on operations opened for it (`broker`: a connection named `name`)."""

    async def run() -> T:
        opened = open_operations(
            settings, name=name, store=store, broker=broker, publisher=publisher
        )
        async with opened as ops:
            return await action(ops)

    return asyncio.run(run())
