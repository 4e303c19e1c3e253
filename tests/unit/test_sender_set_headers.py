"""Headers a sender may not set decide nothing (issue 33, item 1): a message published with a
delivery count, death records or orderflow's own headers of any type and shape ends exactly as
the same message without them, whatever its handling does.

Issue 33: a valid order sent with `x-delivery-count: 99` was dead-lettered at its first delivery
as `redelivery-limit`, "delivered 100 times". On a first delivery every such header is the
sender's (RabbitMQ writes its count only on a redelivery; shared/broker/delivery.py).

The real consumer on the memory broker (which writes `x-delivery-count` and sets `redelivered`
as RabbitMQ 3.10 does: tests/contract/test_broker.py runs the same case on both), under virtual
time; its senders told apart as in the generated definitions (`h-submission` consumes
`h.orders`, which takes applications' orders).
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

from hypothesis import example, given, note, settings
from hypothesis import strategies as st

from harness.simulation import loop as virtual
from shared.broker import envelope as env
from shared.broker.consumer import Consumer, ConsumerPolicy, Delivery
from shared.broker.dead_letters import REPLAYED_AT, REPLAYED_BY
from shared.broker.memory import MemoryBroker, connect
from shared.broker.port import Outgoing
from shared.broker.publisher import Publisher
from shared.broker.topology import Names, QueuePolicy, declare_topology
from shared.domain.messages import SubmitOrder
from shared.errors import InvalidMessage
from shared.store.memory import MemoryStore
from tests.support.factories import order_data
from tests.support.waiting import eventually

HUB = "h"
OWN = f"{HUB}-submission"
LIMIT = 3
RETRIES = 2

# Any value an AMQP client sends in a field table (those pamqp encodes), nested.
field_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False, width=32)
    | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.text(min_size=1, max_size=12), inner, max_size=3)
    ),
    max_leaves=8,
)
death_records = st.lists(
    st.fixed_dictionaries(
        {
            "reason": st.sampled_from(["rejected", "expired", "delivery_limit", "maxlen"]),
            "queue": st.sampled_from([f"{HUB}.orders", f"{HUB}.orders.retry", "elsewhere"]),
            "count": st.integers(0, 10**6),
            "exchange": st.sampled_from(["", f"{HUB}.submit"]),
        }
    ),
    max_size=3,
)
OURS = sorted(
    {
        getattr(env, name)
        for name in dir(env)
        if isinstance(getattr(env, name), str) and getattr(env, name).startswith(env.OURS)
    }
    - {env.OURS, env.SEAL}
    | {REPLAYED_AT, REPLAYED_BY}
)
"""orderflow's own headers (a seal from anyone but the operator is refused as a forgery, by
design: tests/system/test_least_privilege.py)."""
sender_headers = st.dictionaries(
    st.sampled_from(
        [
            "x-delivery-count",
            "x-acquired-count",
            "x-death",
            "x-first-death-reason",
            "x-first-death-queue",
            "x-last-death-reason",
            *OURS,
        ]
    )
    | st.builds(lambda tail: env.OURS + tail, st.text("abcdefgh-", min_size=1, max_size=8)),
    field_values,
    max_size=6,
).flatmap(
    lambda headers: st.one_of(
        st.just(headers),
        death_records.map(lambda deaths: headers | {"x-death": deaths}),
        st.integers(0, 10**6).map(lambda n: headers | {"x-delivery-count": n}),
    )
)

HANDLINGS = ["ok", "fails-once", "fails-always", "permanent", "malformed", "unauthorised"]


class Run:
    """One message's life on a fresh broker: what the handler saw and what was dead-lettered."""

    def __init__(self) -> None:
        self.handled: list[tuple[Any, ...]] = []
        self.calls = 0

    async def handler(self, delivery: Delivery, handling: str) -> None:
        self.calls += 1
        self.handled.append(
            (delivery.message_id, delivery.deliveries, delivery.retries, delivery.user_id)
        )
        if handling == "permanent":
            raise InvalidMessage("refused by its handler", reason="conflict")
        if handling == "fails-always" or (handling == "fails-once" and self.calls == 1):
            raise RuntimeError("the handler failed")


async def outcome(handling: str, headers: dict[str, Any]) -> dict[str, Any]:
    broker = MemoryBroker()
    names = Names(HUB)
    admin = connect(broker, f"{HUB}-admin")
    await declare_topology(
        await admin.admin(),
        names,
        QueuePolicy(quorum=True, delivery_limit=LIMIT, orders_max_length=100),
    )
    store = MemoryStore()
    await store.init()
    own = connect(broker, OWN)
    run = Run()

    async def handler(delivery: Delivery) -> None:
        await run.handler(delivery, handling)

    consumer = Consumer(
        connection=own,
        queue=names.orders,
        names=names,
        handler=handler,
        store=store,
        dead_letter_publisher=await Publisher.open(own, timeout=5),
        policy=ConsumerPolicy(
            prefetch=10,
            redelivery_limit=LIMIT,
            max_message_bytes=65536,
            dedupe_window=timedelta(hours=1),
            claim_ttl=timedelta(seconds=30),
            handler_timeout=5.0,
            delayed_retries=RETRIES,
            retry_delay=1.0,
            own_user=OWN,
        ),
        holder="submission-1",
    )
    await consumer.start()
    user = f"{HUB}-scheduler" if handling == "unauthorised" else "shop"
    body = (
        b"{not json" if handling == "malformed" else SubmitOrder(order=order_data("o-1")).to_json()
    )
    sender = await Publisher.open(connect(broker, user), timeout=5)
    await sender.publish_raw(
        Outgoing(
            body,
            message_id="order:o-1",
            type="order.submit",
            content_type="application/json",
            headers=headers,
        ),
        exchange=names.submit,
        routing_key=names.orders,
    )

    async def settled() -> bool:
        """Nothing in either queue, nothing delivered and not yet settled (the broker's view:
        a delivery is in hand from its dispatch on, before its consumer's task starts)."""
        queues = [broker.queues[q] for q in (names.orders, names.retry(names.orders))]
        return not any(q.ready or any(c.in_hand for c in q.consumers) for q in queues)

    await asyncio.sleep(0)
    await eventually(settled, timeout=60, interval=0.1, what="the message settled")
    dead = []
    dlq = await own.feed(prefetch=0)
    while (letter := await dlq.get(names.dlq(names.orders))) is not None:
        await letter.ack()
        kept = {
            k: v
            for k, v in (letter.headers or {}).items()
            if k in (env.REASON, env.DELIVERIES, env.SENDER, env.RETRIES)
        }
        dead.append((letter.message_id, letter.body, kept))
    await consumer.stop(drain_timeout=1)
    return {"handled": run.handled, "dead": dead}


@settings(max_examples=150, deadline=None)
@given(handling=st.sampled_from(HANDLINGS), headers=sender_headers)
@example(handling="ok", headers={"x-delivery-count": 99})
@example(handling="ok", headers={"x-delivery-count": 1})
@example(handling="fails-always", headers={env.RETRIES: RETRIES})
@example(handling="ok", headers={"x-death": [{"reason": "rejected", "count": 99}]})
def test_what_a_sender_sets_of_the_brokers_and_our_headers_changes_nothing(
    handling: str, headers: dict[str, Any]
) -> None:
    note(f"handling={handling} headers={headers!r}")
    clean = virtual.run(outcome(handling, {}))
    sent = virtual.run(outcome(handling, headers))
    assert sent == clean
    assert clean["handled"] or clean["dead"]
