"""Which acks one `multiple` ack may settle (shared/broker/acks.py): never a delivery of the
channel still in hand below its tag, whatever is in hand and whatever is being acked."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, cast

from hypothesis import given
from hypothesis import strategies as st

from shared.broker.acks import Acks


@dataclass(eq=False)
class _Delivery:
    """What `Acks` reads of an aio-pika delivery."""

    channel: object
    delivery_tag: int
    processed: bool = False


CHANNELS = (object(), object())  # the channel now, and an earlier incarnation of it


@st.composite
def hands(draw: st.DrawFn) -> tuple[list[_Delivery], list[_Delivery]]:
    """(the deliveries in hand, those of them being acked now: at least one)."""
    tags = draw(st.lists(st.integers(1, 60), min_size=1, max_size=20, unique=True))
    in_hand = [
        _Delivery(
            channel=CHANNELS[draw(st.integers(0, 1))],
            delivery_tag=tag,
            processed=draw(st.booleans()),
        )
        for tag in tags
    ]
    acking = draw(st.lists(st.sampled_from(in_hand), min_size=1, unique_by=id))
    for delivery in acking:
        delivery.processed = False  # an ack is asked for only for a delivery not yet settled
    return in_hand, acking


@given(hands())
def test_a_multiple_ack_never_covers_a_delivery_still_in_hand(
    drawn: tuple[list[_Delivery], list[_Delivery]],
) -> None:
    in_hand, acking = drawn
    loop = asyncio.new_event_loop()
    try:
        batch = [(cast(Any, d), loop.create_future()) for d in acking]
        together, alone = Acks(cast(Any, in_hand)).together(batch)
    finally:
        loop.close()
    sent = [d for d, _ in together]
    assert sorted(map(id, sent + [d for d, _ in alone])) == sorted(map(id, acking))
    if len(sent) > 1:
        channel = sent[-1].channel
        top = sent[-1].delivery_tag
        assert [d.delivery_tag for d in sent] == sorted(d.delivery_tag for d in sent)
        assert all(d.channel is channel for d in sent)
        unsettled = [
            d for d in in_hand if d.channel is channel and not d.processed and d not in acking
        ]
        assert all(d.delivery_tag > top for d in unsettled), "it would ack one still in hand"


@given(st.lists(st.integers(1, 60), min_size=2, max_size=20, unique=True))
def test_acks_of_one_channel_with_nothing_else_in_hand_go_as_one(tags: list[int]) -> None:
    in_hand = [_Delivery(CHANNELS[0], tag) for tag in tags]
    loop = asyncio.new_event_loop()
    try:
        batch = [(cast(Any, d), loop.create_future()) for d in in_hand]
        together, alone = Acks(cast(Any, in_hand)).together(batch)
    finally:
        loop.close()
    assert alone == []
    assert [d.delivery_tag for d, _ in together] == sorted(tags)
