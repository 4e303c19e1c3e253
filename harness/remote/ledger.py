"""The remote service's durable ledger of effects, keyed by idempotency key (SQLite), and of
attempts: every call it was asked, whatever it answered.

One effect per key: a repeated key returns the first outcome and makes no second effect. Fencing
tokens (instance ids `<order_id>:<attempt>.<nonce>`, shared/domain/identity.py) only move forward
per order: a request carrying an older attempt than one already seen is refused, and so is one
carrying another token of the attempt number seen last. The first token that makes an effect at
an attempt number owns that number: a second one is a claim that a rollback took back and made
again (same number, another nonce), and the two must never both act. Once an undo of an
operation is recorded for an order (whether it undid an effect or found none), no effect of that
operation is made for the order any more: an undo commutes with the call it undoes, so a call
that arrives, or wakes from a hang, after its undo can never leave an effect without one. Keys,
orders and fences are scoped by the calling **account** (as a payment provider scopes idempotency
keys by API key): two deployments (task hubs) calling one remote service never share an effect,
even for the same order id.

Attempts are written when a call arrives, before anything can delay it (latency, a hang), and
get their answer when it is sent, so a call is counted even if the service dies during it.
"""

from __future__ import annotations

import dataclasses
import json
import sqlite3
from dataclasses import dataclass
from typing import Any

from shared import clock
from shared.domain.identity import attempt_of
from shared.errors import StaleFencingToken, Undone

SCHEMA = """
CREATE TABLE IF NOT EXISTS account_effects (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    account TEXT NOT NULL,
    idempotency_key TEXT NOT NULL,
    operation TEXT NOT NULL,
    order_id TEXT NOT NULL,
    fencing_token TEXT NOT NULL,
    outcome TEXT NOT NULL,
    result TEXT NOT NULL,
    at TEXT NOT NULL,
    UNIQUE (account, idempotency_key)
);
CREATE INDEX IF NOT EXISTS account_effects_by_order ON account_effects (account, order_id, seq);
CREATE TABLE IF NOT EXISTS account_attempts (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    account TEXT NOT NULL,
    order_id TEXT NOT NULL,
    operation TEXT NOT NULL,
    idempotency_key TEXT NOT NULL,
    fencing_token TEXT NOT NULL,
    outcome TEXT NOT NULL,
    hung INTEGER NOT NULL DEFAULT 0,
    arrived_at TEXT NOT NULL,
    answered_at TEXT
);
CREATE INDEX IF NOT EXISTS account_attempts_by_order ON account_attempts (account, order_id, seq);
CREATE TABLE IF NOT EXISTS account_fences (
    account TEXT NOT NULL,
    order_id TEXT NOT NULL,
    attempt INTEGER NOT NULL,
    token TEXT,
    PRIMARY KEY (account, order_id)
);
"""

MIGRATE_UNSCOPED = """
INSERT INTO account_effects
    (seq, account, idempotency_key, operation, order_id, fencing_token, outcome, result, at)
    SELECT seq, '', idempotency_key, operation, order_id, fencing_token, outcome, result, at
      FROM effects;
INSERT INTO account_fences (account, order_id, attempt) SELECT '', order_id, attempt FROM fences;
DROP TABLE effects;
DROP TABLE fences;
"""
"""A ledger written before accounts existed: its effects belong to the unnamed account."""

OWN_FENCES = """
UPDATE account_fences SET token = (
    SELECT e.fencing_token FROM account_effects AS e
     WHERE e.account = account_fences.account AND e.order_id = account_fences.order_id
     ORDER BY e.seq DESC LIMIT 1)
 WHERE token IS NULL;
"""
"""A ledger written before fences kept their token: each fence's token is that of the order's
newest effect. A new effect is made only at the fence's attempt or above, and moves the fence to
its own, so the newest effect's token is the one that holds the fence's attempt."""

COLUMNS = "seq, account, idempotency_key, operation, order_id, fencing_token, outcome, result, at"
ATTEMPT_COLUMNS = (
    "seq, account, order_id, operation, idempotency_key, fencing_token, outcome, hung, "
    "arrived_at, answered_at"
)
UNANSWERED = "unanswered"
"""An attempt's outcome until its answer is sent (for good, if the service died meanwhile)."""


@dataclass(frozen=True)
class Effect:
    seq: int
    account: str
    idempotency_key: str
    operation: str
    order_id: str
    fencing_token: str
    outcome: str
    """`applied`, `declined` (a permanent business failure) or `noop` (an undo of nothing)."""
    result: dict[str, Any]
    at: str

    def to_json(self) -> dict[str, Any]:
        return {
            "seq": self.seq,
            "account": self.account,
            "idempotency_key": self.idempotency_key,
            "operation": self.operation,
            "order_id": self.order_id,
            "fencing_token": self.fencing_token,
            "outcome": self.outcome,
            "result": self.result,
            "at": self.at,
        }


@dataclass(frozen=True)
class Attempt:
    """One call the service was asked, and what it answered."""

    seq: int
    account: str
    order_id: str
    operation: str
    idempotency_key: str
    fencing_token: str
    outcome: str
    """`applied`, `replayed`, `noop`, `declined`, `fenced`, `undone`, `rejected`, `transient`,
    `outage`, or `unanswered` (still in progress, or the service died during it)."""
    hung: bool
    """The call hung (the `hang_rate` knob) before it got its outcome."""
    arrived_at: str
    answered_at: str | None

    def to_json(self) -> dict[str, Any]:
        return {
            "seq": self.seq,
            "account": self.account,
            "order_id": self.order_id,
            "operation": self.operation,
            "idempotency_key": self.idempotency_key,
            "fencing_token": self.fencing_token,
            "outcome": self.outcome,
            "hung": self.hung,
            "arrived_at": self.arrived_at,
            "answered_at": self.answered_at,
        }


def _now() -> str:
    """The service's clock, to the microsecond (shared/clock.py)."""
    return clock.now().isoformat()


class Ledger:
    def __init__(self, path: str) -> None:
        self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")  # durable across a process crash
        self._db.executescript(SCHEMA)
        old = self._db.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'effects'"
        ).fetchone()
        if old is not None:
            self._db.executescript(f"BEGIN; {MIGRATE_UNSCOPED} {OWN_FENCES} COMMIT;")
        columns = {row[1] for row in self._db.execute("PRAGMA table_info(account_fences)")}
        if "token" not in columns:
            self._db.executescript(
                f"BEGIN; ALTER TABLE account_fences ADD COLUMN token TEXT; {OWN_FENCES} COMMIT;"
            )

    def close(self) -> None:
        self._db.close()

    def find(self, account: str, idempotency_key: str) -> Effect | None:
        row = self._db.execute(
            f"SELECT {COLUMNS} FROM account_effects WHERE account = ? AND idempotency_key = ?",
            (account, idempotency_key),
        ).fetchone()
        return None if row is None else _effect(row)

    def effects_of(self, account: str | None, order_id: str) -> list[Effect]:
        """One order's effects in ledger order: in one account, or in every account (None)."""
        rows = self._db.execute(
            f"SELECT {COLUMNS} FROM account_effects WHERE order_id = ? "
            "AND (? IS NULL OR account = ?) ORDER BY seq",
            (order_id, account, account),
        ).fetchall()
        return [_effect(r) for r in rows]

    def page(self, *, after: int, limit: int, account: str | None = None) -> list[Effect]:
        """Effects in ledger order after `after`: of one account, or of all (None)."""
        rows = self._db.execute(
            f"SELECT {COLUMNS} FROM account_effects WHERE seq > ? "
            "AND (? IS NULL OR account = ?) ORDER BY seq LIMIT ?",
            (after, account, account, limit),
        ).fetchall()
        return [_effect(r) for r in rows]

    def record(
        self,
        *,
        account: str,
        idempotency_key: str,
        operation: str,
        order_id: str,
        fencing_token: str,
        outcome: str,
        result: dict[str, Any],
        undone_by: tuple[str, ...] = (),
    ) -> tuple[Effect, bool]:
        """Record an effect unless its key has one; (the effect, True if this call made it).

        Raises `StaleFencingToken` for a new effect whose attempt is older than one seen, or
        whose token is not the one that holds its attempt number, and
        `Undone` for a new effect when one of the operations `undone_by` (the undos of this
        one) is recorded for the order. Everything happens in one transaction, so two requests
        never both make an effect, and no effect is made after its undo.
        """
        db = self._db
        db.execute("BEGIN IMMEDIATE")
        try:
            existing = self.find(account, idempotency_key)
            if existing is not None:
                db.execute("COMMIT")
                return existing, False
            self._admit(account, order_id, operation, fencing_token, undone_by)
            named = (account, idempotency_key, operation, order_id, fencing_token, outcome)
            effect = self._insert(Effect(0, *named, result, _now()))  # its seq comes with it
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        return effect, True

    def _admit(
        self,
        account: str,
        order_id: str,
        operation: str,
        fencing_token: str,
        undone_by: tuple[str, ...],
    ) -> None:
        """Refuse a new effect of a superseded attempt, or of an operation undone first; else
        move the order's fence to `fencing_token`. Within `record`'s transaction."""
        self._check_fence(account, order_id, fencing_token)
        undo = self._undo_of(account, order_id, undone_by)
        if undo is not None:
            raise Undone(f"{operation} of {order_id} was undone first ({undo})")
        # Admitted: the token's attempt is the fence's or above, so it holds the fence now.
        self._db.execute(
            "INSERT INTO account_fences (account, order_id, attempt, token) VALUES (?, ?, ?, ?) "
            "ON CONFLICT (account, order_id) "
            "DO UPDATE SET attempt = excluded.attempt, token = excluded.token",
            (account, order_id, attempt_of(fencing_token), fencing_token),
        )

    def _check_fence(self, account: str, order_id: str, fencing_token: str) -> None:
        """Raise `StaleFencingToken` unless the token may act: no attempt of the order made an
        effect yet, or its attempt is above the newest that did, or it is that attempt's token.
        A fence without a token (one no effect has claimed since the upgrade found none to give
        it) is taken by the first token of its attempt."""
        fence = self._fence(account, order_id)
        if fence is None:
            return
        attempt, holder = fence
        mine = attempt_of(fencing_token)
        if mine < attempt:
            raise StaleFencingToken(f"attempt {mine} of {order_id} superseded by {attempt}")
        if mine == attempt and holder is not None and holder != fencing_token:
            raise StaleFencingToken(
                f"{fencing_token} superseded by {holder}, which holds attempt {attempt} of "
                f"{order_id}"
            )

    def _insert(self, effect: Effect) -> Effect:
        """Write a new effect; it with the `seq` the ledger gave it."""
        cur = self._db.execute(
            "INSERT INTO account_effects (account, idempotency_key, operation, order_id, "
            "fencing_token, outcome, result, at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (
                effect.account,
                effect.idempotency_key,
                effect.operation,
                effect.order_id,
                effect.fencing_token,
                effect.outcome,
                json.dumps(effect.result),
                effect.at,
            ),
        )
        return dataclasses.replace(effect, seq=cur.lastrowid or 0)

    def _fence(self, account: str, order_id: str) -> tuple[int, str | None] | None:
        """The newest attempt of the order that made an effect in the account, if any did, and
        the token that holds it."""
        row = self._db.execute(
            "SELECT attempt, token FROM account_fences WHERE account = ? AND order_id = ?",
            (account, order_id),
        ).fetchone()
        return None if row is None else (int(row[0]), row[1])

    def _undo_of(self, account: str, order_id: str, undos: tuple[str, ...]) -> str | None:
        """The first of `undos` recorded for the order (any outcome), as `<operation> <outcome>`."""
        if not undos:
            return None
        marks = ", ".join("?" * len(undos))
        row = self._db.execute(
            f"SELECT operation, outcome FROM account_effects WHERE account = ? AND order_id = ? "
            f"AND operation IN ({marks}) ORDER BY seq LIMIT 1",
            (account, order_id, *undos),
        ).fetchone()
        return None if row is None else f"{row[0]} {row[1]}"

    # -- attempts: every call, whatever it was answered
    def attempt_arrived(
        self,
        *,
        account: str,
        order_id: str,
        operation: str,
        idempotency_key: str,
        fencing_token: str,
    ) -> int:
        """Count a call as it arrives; its `seq`, for `attempt_answered`."""
        cur = self._db.execute(
            "INSERT INTO account_attempts (account, order_id, operation, idempotency_key, "
            "fencing_token, outcome, arrived_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
            (
                account,
                order_id,
                operation,
                idempotency_key,
                fencing_token,
                UNANSWERED,
                _now(),
            ),
        )
        return cur.lastrowid or 0

    def attempt_answered(self, seq: int, outcome: str, *, hung: bool) -> None:
        self._db.execute(
            "UPDATE account_attempts SET outcome = ?, hung = ?, answered_at = ? WHERE seq = ?",
            (outcome, int(hung), _now(), seq),
        )

    def attempts_of(self, account: str | None, order_id: str) -> list[Attempt]:
        """One order's attempts in arrival order: in one account, or in every account (None)."""
        rows = self._db.execute(
            f"SELECT {ATTEMPT_COLUMNS} FROM account_attempts WHERE order_id = ? "
            "AND (? IS NULL OR account = ?) ORDER BY seq",
            (order_id, account, account),
        ).fetchall()
        return [_attempt(r) for r in rows]

    def attempts_page(self, *, after: int, limit: int, account: str | None = None) -> list[Attempt]:
        """Attempts in arrival order after `after`: of one account, or of all (None)."""
        rows = self._db.execute(
            f"SELECT {ATTEMPT_COLUMNS} FROM account_attempts WHERE seq > ? "
            "AND (? IS NULL OR account = ?) ORDER BY seq LIMIT ?",
            (after, account, account, limit),
        ).fetchall()
        return [_attempt(r) for r in rows]

    def observe_fence(self, account: str, order_id: str, fencing_token: str) -> None:
        """Refuse now if the token is stale (used before a call hangs or waits)."""
        self._check_fence(account, order_id, fencing_token)


def _effect(row: tuple[Any, ...]) -> Effect:
    seq, account, key, operation, order_id, token, outcome, result, at = row
    return Effect(seq, account, key, operation, order_id, token, outcome, json.loads(result), at)


def _attempt(row: tuple[Any, ...]) -> Attempt:
    seq, account, order_id, operation, key, token, outcome, hung, arrived, answered = row
    return Attempt(
        seq, account, order_id, operation, key, token, outcome, bool(hung), arrived, answered
    )
