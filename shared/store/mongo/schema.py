"""The MongoDB store's indexes: what `orderflow init` creates (and the compose deployment's
init script is generated from, `deployment/mongodb.py`)."""

from __future__ import annotations

from pymongo import ASCENDING, DESCENDING
from pymongo.errors import OperationFailure

from shared.errors import ConfigurationError, one_line
from shared.store.mongo.connection import MongoPart
from shared.store.mongo.errors import AUTH_CODES, INDEX_CONFLICT_CODES


class MongoSchema(MongoPart):
    async def init(self) -> None:
        try:
            await self._create_indexes()
        except OperationFailure as exc:
            if exc.code in INDEX_CONFLICT_CODES:
                raise ConfigurationError(
                    f"an index of database {self._db.name} exists with other options or keys "
                    "than this release creates; an index's options cannot change: drop that "
                    "index (db.<collection>.dropIndex(<name>)), then run `orderflow init` again "
                    f"[{one_line(exc)}]"
                ) from exc
            if exc.code in AUTH_CODES:
                raise ConfigurationError(
                    f"the user may not create indexes in database {self._db.name}: {one_line(exc)}"
                ) from exc
            raise

    async def _create_indexes(self) -> None:
        s = self._state
        await s.create_index(
            [("next_attempt_at", ASCENDING)],
            name="state_claimable",
            partialFilterExpression={"process_state": "Pending", "locked_by": None},
        )
        await s.create_index(
            [("next_attempt_at", ASCENDING)],
            name="state_compensation_claimable",
            partialFilterExpression={"process_state": "Compensating", "locked_by": None},
        )
        await s.create_index(
            [("process_state", ASCENDING), ("complete_by", ASCENDING), ("_id", ASCENDING)],
            name="state_deadlines",
        )
        await s.create_index(
            [("process_state", ASCENDING), ("updated_at", DESCENDING)], name="state_by_state"
        )
        await self._history.create_index(
            [("order_id", ASCENDING), ("at", ASCENDING), ("_id", ASCENDING)],
            name="history_by_order",
        )
        await self._compensation.create_index(
            [("order_id", ASCENDING), ("seq", ASCENDING)], name="compensation_by_order"
        )
        # Retention: the journal expires by its own time, oldest first (see `purge_journal`).
        await self._history.create_index(
            [("at", ASCENDING), ("_id", ASCENDING)], name="history_by_time"
        )
        await self._compensation.create_index(
            [("recorded_at", ASCENDING), ("_id", ASCENDING)], name="compensation_by_time"
        )
        # MongoDB deletes expired inbox entries itself; `inbox_purge` does it at once.
        await self._inbox.create_index("expires_at", name="inbox_expiry", expireAfterSeconds=0)
        await self._alerts.create_index([("at", DESCENDING)], name="alerts_by_time")
        await self._alerts.create_index(
            [("state.changed_at", ASCENDING)], name="alerts_changed", sparse=True
        )
        await self._components.create_index(
            "expires_at", name="components_expiry", expireAfterSeconds=3600
        )
        # API tokens are keyed by digest (`_id`); one active token per name, which also settles
        # two concurrent creates of one name. A partial filter may test equality with null: it
        # matches a revoked_at that is null (every active token's: it is always written).
        await self._tokens.create_index(
            [("name", ASCENDING)],
            name="api_tokens_active_name",
            unique=True,
            partialFilterExpression={"revoked_at": None},
        )
