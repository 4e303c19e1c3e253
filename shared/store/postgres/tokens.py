"""API tokens on PostgreSQL (`ApiTokens`): the table `api_tokens`, keyed by digest, with one
active token per name (the partial unique index `api_tokens_active_name`)."""

from __future__ import annotations

from datetime import datetime

from shared.domain.tokens import ApiToken
from shared.store.postgres.connection import PostgresPart, affected, read_row


class PostgresTokens(PostgresPart):
    async def token_create(self, token: ApiToken) -> bool:
        # No conflict target: a taken digest and an active name alike write nothing. Of two
        # concurrent inserts of one name, the second waits for the first and then does nothing.
        created = await self._pool.fetchval(
            f"INSERT INTO {self._s}.api_tokens (digest, name, role, created_at, revoked_at, "
            "schema_version) VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT DO NOTHING RETURNING true",
            token.digest,
            token.name,
            token.role.value,
            token.created_at,
            token.revoked_at,
            token.schema_version,
        )
        return bool(created)

    async def token_find(self, digest: str) -> ApiToken | None:
        row = await self._pool.fetchrow(
            f"SELECT * FROM {self._s}.api_tokens WHERE digest = $1 AND revoked_at IS NULL", digest
        )
        return None if row is None else read_row(ApiToken, row)

    async def token_revoke(self, name: str, *, at: datetime) -> bool:
        result = await self._pool.execute(
            f"UPDATE {self._s}.api_tokens SET revoked_at = $2 "
            "WHERE name = $1 AND revoked_at IS NULL",
            name,
            at,
        )
        return affected(result) == 1

    async def token_list(self) -> list[ApiToken]:
        rows = await self._pool.fetch(
            # Names in code point order whatever the database's collation, as the other stores.
            f'SELECT * FROM {self._s}.api_tokens ORDER BY created_at DESC, name COLLATE "C", digest'
        )
        return [read_row(ApiToken, r) for r in rows]
