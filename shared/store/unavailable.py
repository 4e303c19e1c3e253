"""Turning a store driver's errors into orderflow's, in one place.

Two classes of driver error mean something to the callers: the store cannot be reached (hold
the work and retry: `StoreUnavailable`), and the store refuses a value it cannot hold (the
same write fails the same way every time: `StoreRefused`, dead-lettered at once). A refusal is
checked first: asyncpg's client-side `DataError` is also an `InterfaceError`.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

from shared.errors import StoreRefused, StoreUnavailable, one_line

C = TypeVar("C", bound=type)

Refusal = Callable[[BaseException], bool]
"""Whether a driver error is a refusal of the data (beyond its type, e.g. a server code)."""

OutageSeen = Callable[[Any, BaseException], Awaitable[None]]
"""What the adapter does about an outage (its instance, the driver's error) before it is raised
as `StoreUnavailable`: e.g. drop the connections to a server that stopped taking writes."""


def translate_errors(
    store: str,
    *,
    unavailable: tuple[type[BaseException], ...],
    refused: tuple[type[BaseException], ...] = (),
    refusal: Refusal | None = None,
    outage: Refusal | None = None,
    on_outage: OutageSeen | None = None,
) -> Callable[[C], C]:
    """Class decorator: every public coroutine method, its own or inherited, raises
    `StoreRefused` for `refused` errors (and those `refusal` accepts) and `StoreUnavailable` for
    `unavailable` ones (and those `outage` accepts: a server code that means "try later"),
    after `on_outage` has seen them."""

    def wrap(method: Callable[..., Coroutine[Any, Any, Any]]) -> Callable[..., Any]:
        @functools.wraps(method)
        async def guarded(*args: Any, **kwargs: Any) -> Any:
            try:
                return await method(*args, **kwargs)
            except Exception as exc:
                if _matches(exc, refused, refusal):
                    raise StoreRefused(f"{store} refused the data: {one_line(exc)}") from exc
                if _matches(exc, unavailable, outage):
                    if on_outage is not None and args:
                        await on_outage(args[0], exc)
                    raise StoreUnavailable(f"{store} unavailable: {one_line(exc)}") from exc
                raise

        return guarded

    def decorate(cls: C) -> C:
        for name, member in _coroutine_methods(cls).items():
            setattr(cls, name, wrap(member))
        return cls

    return decorate


def _matches(
    exc: BaseException, types: tuple[type[BaseException], ...], predicate: Refusal | None
) -> bool:
    return isinstance(exc, types) or (predicate is not None and predicate(exc))


def _coroutine_methods(cls: type) -> dict[str, Callable[..., Coroutine[Any, Any, Any]]]:
    """The public coroutine methods of `cls`, its own and inherited (an adapter is composed of
    parts, one class per concern), each as the MRO resolves its name."""
    found: dict[str, Any] = {}
    for klass in reversed(cls.__mro__):
        found.update(vars(klass))  # a later (more derived) class overrides an earlier one
    return {
        name: member
        for name, member in found.items()
        if not name.startswith("_") and inspect.iscoroutinefunction(member)
    }
