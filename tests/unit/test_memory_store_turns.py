"""The memory store yields to the loop once before every operation, through one mechanism
(`MemoryPart.__init_subclass__` wrapping each public coroutine method in `yielding`)."""

from __future__ import annotations

import asyncio
import inspect

from shared.store.memory import MemoryStore
from shared.store.port import StateStore


def operations() -> list[str]:
    return sorted(
        name
        for name, member in inspect.getmembers(MemoryStore)
        if not name.startswith("_") and inspect.iscoroutinefunction(member)
    )


def test_every_operation_of_the_port_is_wrapped_exactly_once() -> None:
    names = operations()
    port = {
        name
        for name in dir(StateStore)
        if not name.startswith("_") and inspect.iscoroutinefunction(getattr(StateStore, name))
    }
    assert len(port) > 40 and port <= set(names), port - set(names)
    for name in names:
        method = getattr(MemoryStore, name)
        inner = getattr(method, "__wrapped__", None)
        assert inner is not None, f"{name} does not yield to the loop"
        assert not hasattr(inner, "__wrapped__"), f"{name} yields twice"


async def test_another_task_runs_before_an_operation_returns() -> None:
    store = MemoryStore()
    ran: list[str] = []

    async def other() -> None:
        ran.append("other")

    task = asyncio.create_task(other())
    await store.get_state("o-1")
    assert ran == ["other"]
    await task
