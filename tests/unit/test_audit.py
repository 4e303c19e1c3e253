"""`orderflow audit`'s invariant 5 on what `dlq list` reads: every dead letter has a reason."""

from __future__ import annotations

from services.operator.invariants import AuditReport, check_dead_letters


def test_a_dead_letter_without_a_reason_violates_invariant_5() -> None:
    report = AuditReport()
    check_dead_letters(
        report,
        [
            {"message_id": "m1", "queue": "shop.orders", "reason": "malformed"},
            {"message_id": "m2", "queue": "shop.agent.payment", "reason": None},
        ],
    )
    assert report.dead_letters == 2
    assert report.violations == [
        {
            "invariant": 5,
            "order_id": None,
            "message": "dead letter m2 in shop.agent.payment has no reason",
        }
    ]
    assert not report.to_json()["ok"]
