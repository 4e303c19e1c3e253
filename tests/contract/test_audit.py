"""Contract: `orderflow audit`'s invariant 4 (a conflicting resubmission never overwrites the
first order) against every store adapter, from records written as the processes write them."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from services.operator import invariants
from services.operator.invariants import audit
from shared.domain.journal import Alert, AlertKind, HistoryEvent, HistoryEventType, Severity
from shared.domain.models import OrderRecord
from shared.domain.timing import utcnow
from shared.store.port import StateStore
from tests.support.factories import order_data, order_pair


async def _submitted(store: StateStore, order: OrderRecord, fingerprint: str) -> None:
    await store.append_history(
        HistoryEvent(
            order_id=order.order_id,
            type=HistoryEventType.ORDER_SUBMITTED,
            at=utcnow(),
            data={"fingerprint": fingerprint},
        )
    )


async def _violations(store: StateStore) -> list[tuple[int, str | None, str]]:
    report = await audit(store, [], now=utcnow(), grace=timedelta(seconds=5))
    return [(v["invariant"], v["order_id"], v["message"]) for v in report.violations]


async def test_the_audit_proves_the_first_submission_was_kept(store: StateStore) -> None:
    kept, kept_state = order_pair("o-kept")
    await store.insert_order(kept, kept_state)
    await _submitted(store, kept, kept.fingerprint)
    # A conflicting resubmission, refused as the submission process refuses it: an alert that
    # names the refused data's fingerprint, and the first order untouched.
    refused = OrderRecord.of(order_data("o-kept", customer_id="c-other"), utcnow())
    assert refused.fingerprint != kept.fingerprint
    await store.raise_alert(
        Alert(
            alert_id=f"conflict:o-kept:{refused.fingerprint[:16]}",
            kind=AlertKind.DUAL_WRITE_CONFLICT,
            severity=Severity.CRITICAL,
            message="order o-kept resubmitted with different data; the first order is kept",
            at=utcnow(),
            order_id="o-kept",
        )
    )
    assert await _violations(store) == []


async def test_the_audit_finds_an_order_whose_data_changed_after_submission(
    store: StateStore,
) -> None:
    first = OrderRecord.of(order_data("o-changed"), utcnow())
    later, later_state = order_pair("o-changed", customer_id="c-later")
    # The store holds other data than the OrderSubmitted event recorded: something overwrote.
    await store.insert_order(later, later_state)
    await _submitted(store, later, first.fingerprint)
    await store.raise_alert(
        Alert(
            alert_id=f"conflict:o-changed:{later.fingerprint[:16]}",
            kind=AlertKind.DUAL_WRITE_CONFLICT,
            severity=Severity.CRITICAL,
            message="order o-changed resubmitted with different data",
            at=utcnow(),
            order_id="o-changed",
        )
    )
    found = await _violations(store)
    assert [(n, o) for n, o, _ in found] == [(4, "o-changed"), (4, "o-changed")]
    assert any("changed since first submitted" in m for _, _, m in found)
    assert any("refused as a conflict replaced the first order" in m for _, _, m in found)


async def test_the_audit_reads_alerts_in_pages_and_checks_every_conflict(
    store: StateStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The alerts are read a page at a time, never all in one read; a conflict on any page,
    also among many alerts raised at one time, is checked."""
    monkeypatch.setattr(invariants, "PAGE", 2)
    at = utcnow()
    for n in range(5):  # a page ends among alerts raised at one time
        await store.raise_alert(
            Alert(
                alert_id=f"bad-body:{n}",  # before "conflict:…" among equals
                kind=AlertKind.POISON_MESSAGE,
                severity=Severity.WARNING,
                message="malformed body",
                at=at,
            )
        )
    changed, changed_state = order_pair("o-changed", customer_id="c-later")
    await store.insert_order(changed, changed_state)
    await _submitted(store, changed, changed.fingerprint)
    await store.raise_alert(
        Alert(
            alert_id=f"conflict:o-changed:{changed.fingerprint[:16]}",
            kind=AlertKind.DUAL_WRITE_CONFLICT,
            severity=Severity.CRITICAL,
            message="order o-changed resubmitted with different data",
            at=at,
            order_id="o-changed",
        )
    )
    limits: list[int] = []
    list_alerts = store.list_alerts

    async def counted(**kwargs: Any) -> list[Alert]:
        limits.append(kwargs["limit"])
        return await list_alerts(**kwargs)

    monkeypatch.setattr(store, "list_alerts", counted)
    found = await _violations(store)
    assert [(n, o) for n, o, _ in found] == [(4, "o-changed")]
    assert "refused as a conflict replaced the first order" in found[0][2]
    assert len(limits) == 4 and set(limits) == {2}, limits  # 6 alerts, 2 a page, then none
