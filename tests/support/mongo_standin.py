"""An in-process stand-in for a MongoDB server: mongomock behind PyMongo's async API.

It is NOT MongoDB. It lets the MongoDB adapter's code run through the contract suite where no
MongoDB server can be reached; the tests that use it carry the `mongodb_standin` marker and say so
in their ids. Each call yields to the event loop first, so concurrent callers interleave between
operations (each single-document operation stays atomic, as in MongoDB).
"""

from __future__ import annotations

import asyncio
from typing import Any

import bson
import mongomock

_WRITES = frozenset(
    {
        "insert_one",
        "insert_many",
        "update_one",
        "update_many",
        "replace_one",
        "find_one_and_update",
        "find_one_and_replace",
    }
)


def _encode_like_the_driver(args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """PyMongo encodes every document it sends as BSON and refuses what BSON cannot hold (NUL
    in a key, an integer beyond 64 bits, an unpaired surrogate); mongomock does not. Encoding
    here makes the stand-in refuse the same writes the driver would."""
    for value in (*args, *kwargs.values()):
        for doc in value if isinstance(value, list) else [value]:
            if isinstance(doc, dict):
                bson.encode(doc)


class _Cursor:
    def __init__(self, cursor: Any) -> None:
        self._cursor = cursor

    def sort(self, *args: Any, **kwargs: Any) -> _Cursor:
        self._cursor = self._cursor.sort(*args, **kwargs)
        return self

    def limit(self, n: int) -> _Cursor:
        self._cursor = self._cursor.limit(n)
        return self

    async def to_list(self, length: int | None = None) -> list[Any]:
        await asyncio.sleep(0)
        docs = list(self._cursor)
        return docs if length is None else docs[:length]

    def __aiter__(self) -> _Cursor:
        return self

    async def __anext__(self) -> Any:
        await asyncio.sleep(0)
        try:
            return next(self._cursor)
        except StopIteration:
            raise StopAsyncIteration from None


class _Collection:
    def __init__(self, collection: Any) -> None:
        self._c = collection

    def find(self, *args: Any, **kwargs: Any) -> _Cursor:
        return _Cursor(self._c.find(*args, **kwargs))

    async def aggregate(self, pipeline: list[dict[str, Any]], **kwargs: Any) -> _Cursor:
        await asyncio.sleep(0)
        return _Cursor(iter(self._c.aggregate(pipeline, **kwargs)))

    async def create_index(self, keys: Any, **kwargs: Any) -> str:
        # mongomock ignores partial filters and TTLs: drop what it cannot take.
        kwargs.pop("partialFilterExpression", None)
        kwargs.pop("expireAfterSeconds", None)
        return str(self._c.create_index(keys, **kwargs))

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._c, name)
        writes = name in _WRITES

        async def call(*args: Any, **kwargs: Any) -> Any:
            await asyncio.sleep(0)
            if writes:
                _encode_like_the_driver(args, kwargs)
            return method(*args, **kwargs)

        return call


class _Client:
    def __init__(self, client: Any) -> None:
        self._client = client

    async def drop_database(self, name: str) -> None:
        self._client.drop_database(name)


class StandInDatabase:
    """The part of `AsyncDatabase` the adapter uses."""

    def __init__(self, name: str) -> None:
        self._mm = mongomock.MongoClient(tz_aware=True)
        self.name = name
        self._db = self._mm[name]
        self.client = _Client(self._mm)

    def __getitem__(self, name: str) -> _Collection:
        return _Collection(self._db[name])

    async def command(self, name: str) -> dict[str, Any]:
        return {"ok": 1.0}
