"""API tokens on MongoDB (`ApiTokens`): the collection `api_tokens`, the digest as `_id`, one
active token per name (the partial unique index `api_tokens_active_name`)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pymongo import ASCENDING, DESCENDING
from pymongo.errors import DuplicateKeyError

from shared.domain.tokens import ApiToken
from shared.store.codec import plain
from shared.store.mongo.connection import MongoPart, load

ACTIVE = {"revoked_at": None}
"""An active token's filter, as the partial index names it (`revoked_at` is always written)."""


class MongoTokens(MongoPart):
    async def token_create(self, token: ApiToken) -> bool:
        doc = plain(token)
        doc["_id"] = doc.pop("digest")
        try:
            await self._tokens.insert_one(doc)
        except DuplicateKeyError:  # the digest, or an active token's name
            return False
        return True

    async def token_find(self, digest: str) -> ApiToken | None:
        doc = await self._tokens.find_one({"_id": digest, **ACTIVE})
        return None if doc is None else _token(doc)

    async def token_revoke(self, name: str, *, at: datetime) -> bool:
        result = await self._tokens.update_one(
            {"name": name, **ACTIVE}, {"$set": {"revoked_at": at}}
        )
        return bool(result.matched_count == 1)

    async def token_list(self) -> list[ApiToken]:
        cursor = self._tokens.find({}).sort(
            [("created_at", DESCENDING), ("name", ASCENDING), ("_id", ASCENDING)]
        )
        return [_token(d) for d in await cursor.to_list(None)]


def _token(doc: dict[str, Any]) -> ApiToken:
    digest = doc.pop("_id")
    token: ApiToken = load(ApiToken, doc, digest=digest)
    return token
