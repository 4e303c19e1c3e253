"""One poison-message alert per queue and reason per window, with the count of the others."""

from __future__ import annotations

from typing import Any

from shared.domain.journal import AlertKind
from shared.reporting import PoisonAlerts
from tests.support.waiting import eventually


class Alerts:
    def __init__(self) -> None:
        self.raised: list[dict[str, Any]] = []

    async def alert(self, kind: AlertKind, message: str, **fields: Any) -> None:
        self.raised.append({"kind": kind, "message": message, **fields})


async def test_a_burst_is_one_alert_per_reason_then_one_with_the_count() -> None:
    now = [0.0]
    alerts = Alerts()
    poison = PoisonAlerts(alerts, "h.orders", window_s=0.2, clock=lambda: now[0])  # type: ignore[arg-type]
    for n in range(1000):
        await poison("malformed", "body is not JSON", f"m{n}")
    await poison("invalid", "order.lines: Field required", "i0")
    assert [(a["reason"], a["more"]) for a in alerts.raised] == [("malformed", 0), ("invalid", 0)]
    assert alerts.raised[0]["alert_id"] == "poison:h.orders:m0:malformed"
    now[0] = 0.3  # the window ends: the count is reported, with no new dead letter needed
    await eventually(lambda: _async(len(alerts.raised) == 3), what="the summary alert")
    summary = alerts.raised[-1]
    assert summary["more"] == 999 and summary["alert_id"] == "poison:h.orders:m999:malformed"
    assert "999 more messages on h.orders dead-lettered (malformed)" in summary["message"]
    await poison("malformed", "body is not JSON", "next")  # in the window the summary opened
    assert len(alerts.raised) == 3


async def _async(value: bool) -> bool:
    return value


async def test_a_conflict_raises_none_here_and_a_zero_window_raises_every_one() -> None:
    alerts = Alerts()
    every = PoisonAlerts(alerts, "h.orders", window_s=0)  # type: ignore[arg-type]
    await every("conflict", "exists with other data", "c")
    for n in range(3):
        await every("malformed", "x", f"m{n}")
    assert [a["message_id"] if "message_id" in a else a["alert_id"] for a in alerts.raised] == [
        "poison:h.orders:m0:malformed",
        "poison:h.orders:m1:malformed",
        "poison:h.orders:m2:malformed",
    ]
