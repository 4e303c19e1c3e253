"""`submit --wait`'s status follower: a final status stands against the statuses that reach it
late (statuses come from several processes, in no order between them;
decision:orders-deduped-by-order)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from services.shop.publish import FINAL, StatusFollower
from shared.config import BrokerSettings
from shared.domain.messages import OrderStatus, OrderStatusUpdate
from shared.domain.states import ProcessState
from shared.domain.timing import utcnow

ORDER = "shop.o-1"


def _status(status: OrderStatus) -> OrderStatusUpdate:
    return OrderStatusUpdate(
        order_id=ORDER, status=status, process_state=ProcessState.PROCESSING, at=utcnow()
    )


def _follower() -> StatusFollower:
    broker = BrokerSettings(rabbitmq_url="amqp://guest:guest@127.0.0.1:5672/")
    return StatusFollower("hub", broker, {ORDER}, lambda _: None)


def _from_ourselves() -> Any:
    return SimpleNamespace(user_id="guest")


@given(st.lists(st.sampled_from(list(OrderStatus)), min_size=1, max_size=12))
def test_the_status_kept_is_the_last_final_one_or_else_the_last(
    statuses: list[OrderStatus],
) -> None:
    follower = _follower()
    for status in statuses:
        follower.on_status(_status(status), _from_ourselves())
    finals = [s for s in statuses if s in FINAL]
    assert follower.statuses[ORDER] == (finals[-1] if finals else statuses[-1])
    assert follower.final() == ({finals[-1].value: 1} if finals else {})


def test_a_received_sent_again_after_completed_leaves_the_order_completed() -> None:
    follower = _follower()
    for status in (OrderStatus.RECEIVED, OrderStatus.COMPLETED, OrderStatus.RECEIVED):
        follower.on_status(_status(status), _from_ourselves())
    assert follower.final() == {"Completed": 1}
