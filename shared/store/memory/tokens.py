"""API tokens in memory, by digest (`ApiTokens`)."""

from __future__ import annotations

from datetime import datetime

from shared.domain.tokens import ApiToken
from shared.store.memory.tables import MemoryPart


def newest_first(tokens: list[ApiToken]) -> list[ApiToken]:
    """The order of `token_list`: newest first, then by name, then by digest."""
    tokens = sorted(tokens, key=lambda t: (t.name, t.digest))
    return sorted(tokens, key=lambda t: t.created_at, reverse=True)


class MemoryTokens(MemoryPart):
    def _active_named(self, name: str) -> ApiToken | None:
        return next((t for t in self._tokens.values() if t.active and t.name == name), None)

    async def token_create(self, token: ApiToken) -> bool:
        # As the real stores' unique indexes: one digest, and one active token per name.
        if token.digest in self._tokens or self._active_named(token.name) is not None:
            return False
        self._tokens[token.digest] = token
        return True

    async def token_find(self, digest: str) -> ApiToken | None:
        token = self._tokens.get(digest)
        return token if token is not None and token.active else None

    async def token_revoke(self, name: str, *, at: datetime) -> bool:
        token = self._active_named(name)
        if token is None:
            return False
        self._tokens[token.digest] = token.model_copy(update={"revoked_at": at})
        return True

    async def token_list(self) -> list[ApiToken]:
        return newest_first(list(self._tokens.values()))
