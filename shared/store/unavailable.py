"""Turning a store driver's connection failures into `StoreUnavailable`, in one place."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from shared.errors import StoreUnavailable, one_line

C = TypeVar("C", bound=type)


def translate_unavailable(errors: tuple[type[BaseException], ...], store: str) -> Callable[[C], C]:
    """Class decorator: every public coroutine method raises `StoreUnavailable` for `errors`."""

    def wrap(method: Callable[..., Coroutine[Any, Any, Any]]) -> Callable[..., Any]:
        @functools.wraps(method)
        async def guarded(*args: Any, **kwargs: Any) -> Any:
            try:
                return await method(*args, **kwargs)
            except errors as exc:
                raise StoreUnavailable(f"{store} unavailable: {one_line(exc)}") from exc

        return guarded

    def decorate(cls: C) -> C:
        for name, member in list(vars(cls).items()):
            if not name.startswith("_") and inspect.iscoroutinefunction(member):
                setattr(cls, name, wrap(member))
        return cls

    return decorate
