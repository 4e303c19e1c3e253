"""The MongoDB store's indexes: what `orderflow init` creates (and the compose deployment's
init script is generated from, `deployment/mongodb.py`), then the journal's move into the state
records of a hub of an older release (shared/store/mongo/migration.py)."""

from __future__ import annotations

from typing import Any

from pymongo import ASCENDING, DESCENDING
from pymongo.errors import ExecutionTimeout, OperationFailure

from shared.config.connections import MAX_CLOCK_SKEW_S
from shared.errors import ConfigurationError, ServiceUnavailable, one_line
from shared.store.mongo.errors import AUTH_CODES, INDEX_CONFLICT_CODES
from shared.store.mongo.migration import MongoMigration

INDEX_NOT_FOUND = 27


class MongoSchema(MongoMigration):
    async def init(self) -> None:
        try:
            await self._create_indexes()
        except ExecutionTimeout as exc:
            # The server ran out of the command's time (MaxTimeMSExpired) on a createIndexes:
            # a replica set commits a new index once every voting member has built it
            # (commitQuorum "votingMembers"), and one member down holds the build. Say what it
            # waits for. (A server that does not answer at all is an outage, as anywhere.)
            raise ServiceUnavailable(
                "an index build has not committed in time: MongoDB commits an index once "
                "every voting member of the replica set has built it, and a member that is "
                "down or far behind holds it (rs.status() shows which). The build goes on "
                "on the server: bring the member back, then run `orderflow init` again "
                f"[{one_line(exc)}]"
            ) from exc
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
        await self.migrate_journal()

    @staticmethod
    async def _drop_index(collection: Any, name: str) -> None:
        """Drop an index an older release made, if it is there (MongoDB keeps one index of a
        key pattern and options, so it goes before its successor is made)."""
        try:
            await collection.drop_index(name)
        except OperationFailure as exc:
            if exc.code != INDEX_NOT_FOUND:
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
        # By state and time, then id: listings newest first (read backwards) and retention
        # oldest first, each in (updated_at, _id) order from the index, merged across states
        # (no sort of every finished record). It replaces `state_by_state`, which had no id.
        await self._drop_index(s, "state_by_state")
        await s.create_index(
            [("process_state", ASCENDING), ("updated_at", ASCENDING), ("_id", ASCENDING)],
            name="state_by_time",
        )
        # MongoDB deletes expired inbox entries itself, by the server's clock, which may be
        # ahead of the processes': only once the most skew the settings allow has passed too, so
        # that it never deletes a live claim (`inbox_purge` deletes on time, by the leader's
        # clock, with the skew allowed). The index of older releases (expiry at once) goes
        # first: MongoDB keeps one index of a key pattern and options.
        await self._drop_index(self._inbox, "inbox_expiry")
        await self._inbox.create_index(
            "expires_at", name="inbox_expiry_late", expireAfterSeconds=MAX_CLOCK_SKEW_S
        )
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
