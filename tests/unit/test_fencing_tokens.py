"""Fencing tokens with a nonce (issue 35, item 3): what a claim issues, what the remote service's
ledger admits, and what the audit flags, when two attempts share an attempt number."""

from __future__ import annotations

import re
import sqlite3
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from harness.remote.ledger import Ledger
from services.operator.invariants import AuditReport, check_fenced_effects
from shared.domain.claims import claim_for
from shared.domain.identity import instance_id, new_nonce, nonce_of, parse_instance_id
from shared.domain.messages import StepAction, StepRequest
from shared.domain.timing import utcnow
from shared.errors import StaleFencingToken

# -- the token a claim issues


def test_a_claims_changes_are_pure_and_another_claim_locks_with_another_token() -> None:
    now = utcnow()
    terms: dict[str, Any] = {"now": now, "limit": 5, "owner": "s", "complete_by": now}
    one, other = claim_for(**terms, compensating=False), claim_for(**terms, compensating=False)
    # An adapter may ask twice for one record (MongoDB's take, then its settle): the same lock.
    assert one.changes("o-1", 2) == one.changes("o-1", 2)
    lock = one.changes("o-1", 2).fields["locked_by"]
    assert parse_instance_id(lock) == ("o-1", 3) and nonce_of(lock) == one.nonce
    # A claim made again at the same attempt (after a rollback) does not repeat it.
    assert other.changes("o-1", 2).fields["locked_by"] != lock


def test_nonces_are_short_and_do_not_repeat() -> None:
    nonces = {new_nonce() for _ in range(1000)}
    assert len(nonces) == 1000
    assert all(len(n) == 8 and nonce_of(instance_id("o", 1, n)) == n for n in nonces)


def test_the_longest_order_ids_token_fits_a_step_request() -> None:
    """A step request bounds its token at 120 characters; the longest order id (a 40-character
    hub, `/`, 64 characters) with attempt 999 and a nonce is within it."""
    order_id = "h" * 40 + "/" + "o" * 64
    token = instance_id(order_id, 999, new_nonce())
    request = StepRequest(
        order_id=order_id,
        step="charge",
        action=StepAction.DO,
        operation="payment.charge",
        fencing_token=token,
        idempotency_key=f"{order_id}:charge",
        complete_by=utcnow() + timedelta(seconds=30),
        attempts_allowed=1,
        reply_to="q",
    )
    assert request.fencing_token == token


def test_a_token_from_before_nonces_still_parses() -> None:
    assert parse_instance_id("shop/o-1:3") == ("shop/o-1", 3)
    assert nonce_of("shop/o-1:3") is None
    with pytest.raises(ValueError):
        nonce_of("o-1")


# -- the remote service's ledger


def effect(ledger: Ledger, key: str, token: str, order_id: str = "o-1") -> bool:
    """Record an applied effect; True if this call made it."""
    _, made = ledger.record(
        account="",
        idempotency_key=key,
        operation="payment.charge",
        order_id=order_id,
        fencing_token=token,
        outcome="applied",
        result={},
    )
    return made


def test_the_first_token_at_an_attempt_number_owns_it() -> None:
    ledger = Ledger(":memory:")
    try:
        assert effect(ledger, "k1", "o-1:1.first")
        # The claim made again after a rollback: the same attempt number, another token.
        superseded = re.escape("o-1:1.again superseded by o-1:1.first")
        with pytest.raises(StaleFencingToken, match=superseded):
            effect(ledger, "k2", "o-1:1.again")
        with pytest.raises(StaleFencingToken):
            ledger.observe_fence("", "o-1", "o-1:1.again")
        with pytest.raises(StaleFencingToken):
            effect(ledger, "k2", "o-1:1")  # nor a token without a nonce at that number
        assert effect(ledger, "k2", "o-1:1.first")  # the owner goes on
        ledger.observe_fence("", "o-1", "o-1:1.first")
        # A repeated key still answers with its first outcome, whoever asks: no new effect.
        assert not effect(ledger, "k1", "o-1:1.again")
        # A higher attempt still wins, and takes the number from then on.
        assert effect(ledger, "k3", "o-1:2.later")
        with pytest.raises(StaleFencingToken, match="attempt 1 of o-1 superseded by 2"):
            effect(ledger, "k4", "o-1:1.first")
        # Each order has its own fence.
        assert effect(ledger, "k5", "o-2:1.again", order_id="o-2")
        assert [e.fencing_token for e in ledger.effects_of("", "o-1")] == [
            "o-1:1.first",
            "o-1:1.first",
            "o-1:2.later",
        ]
    finally:
        ledger.close()


def test_a_token_from_before_nonces_keeps_its_fence() -> None:
    """An order in flight across the upgrade goes on with its old token."""
    ledger = Ledger(":memory:")
    try:
        assert effect(ledger, "k1", "o-1:2")
        assert effect(ledger, "k2", "o-1:2")
        with pytest.raises(StaleFencingToken):
            effect(ledger, "k3", "o-1:2.newer")
        assert effect(ledger, "k3", "o-1:3.newer")
    finally:
        ledger.close()


def test_a_ledger_whose_fences_kept_no_token_gives_each_its_newest_effects(
    tmp_path: Path,
) -> None:
    path = str(tmp_path / "ledger.sqlite3")
    Ledger(path).close()
    db = sqlite3.connect(path)
    db.executescript(
        # The fences table as it was: the attempt only.
        "DROP TABLE account_fences;"
        "CREATE TABLE account_fences (account TEXT NOT NULL, order_id TEXT NOT NULL, "
        "attempt INTEGER NOT NULL, PRIMARY KEY (account, order_id));"
        "INSERT INTO account_effects (account, idempotency_key, operation, order_id, "
        "fencing_token, outcome, result, at) VALUES "
        "('', 'o-1:reserve', 'inventory.reserve', 'o-1', 'o-1:1', 'applied', '{}', 't'),"
        "('', 'o-1:charge', 'payment.charge', 'o-1', 'o-1:2', 'applied', '{}', 't'),"
        "('b', 'o-1:charge', 'payment.charge', 'o-1', 'o-1:1', 'applied', '{}', 't');"
        "INSERT INTO account_fences VALUES ('', 'o-1', 2), ('b', 'o-1', 1);"
    )
    db.close()
    for _ in range(2):  # the second open finds nothing left to upgrade
        ledger = Ledger(path)
        try:
            with pytest.raises(StaleFencingToken):
                ledger.observe_fence("", "o-1", "o-1:2.other")
            with pytest.raises(StaleFencingToken):
                ledger.observe_fence("b", "o-1", "o-1:1.other")
            ledger.observe_fence("", "o-1", "o-1:2")
            ledger.observe_fence("b", "o-1", "o-1:1")
        finally:
            ledger.close()


# -- the audit


def effects(*tokens: str) -> list[dict[str, Any]]:
    return [
        {"seq": seq, "order_id": "o-1", "operation": "payment.charge", "fencing_token": token}
        for seq, token in enumerate(tokens, 1)
    ]


def test_the_audit_flags_two_tokens_acting_at_one_attempt_number() -> None:
    report = AuditReport()
    check_fenced_effects(report, effects("o-1:1.a", "o-1:1.b"))
    assert report.violations == [
        {
            "invariant": 3,
            "order_id": "o-1",
            "message": "payment.charge by o-1:1.b after an effect by o-1:1.a: two tokens of "
            "attempt 1",
        }
    ]


@pytest.mark.parametrize(
    ("tokens", "violated"),
    [
        (("o-1:1.a", "o-1:1.a", "o-1:2.b", "o-1:2.b"), False),
        (("o-1:1", "o-1:1", "o-1:2.b"), False),  # across the upgrade
        (("o-1:1", "o-1:1.a"), True),
        (("o-1:1.a", "o-1:2.b", "o-1:1.a"), True),  # superseded, as before
    ],
)
def test_the_audit_passes_one_token_per_attempt_number_only(
    tokens: tuple[str, ...], violated: bool
) -> None:
    report = AuditReport()
    check_fenced_effects(report, effects(*tokens))
    assert bool(report.violations) is violated, report.violations
    assert all(v["invariant"] == 3 for v in report.violations)
