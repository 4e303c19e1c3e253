"""Contract: what validation accepts, every store holds and gives back exactly; what a store
cannot hold is refused as `StoreRefused` (the same write fails the same way every time, so the
consumer dead-letters its message at once), never reported as an outage or left unexplained.

The stand-in encodes every write as BSON, as PyMongo does, so it refuses what the driver would.
"""

from __future__ import annotations

import random

import pytest

from shared.domain.journal import HistoryEvent, HistoryEventType
from shared.domain.models import Address, OrderData, OrderRecord
from shared.domain.text import unsafe_characters
from shared.domain.timing import utcnow
from shared.errors import StoreRefused
from shared.store.port import InsertOutcome, StateStore
from tests.support.factories import order_data, order_pair

# Characters that are valid text but trip naive code: astral planes, combining marks, joiners,
# right-to-left letters (not controls), noncharacters, private use, the replacement character,
# the BOM as a zero-width space, quotes and backslashes, SQL and JSON syntax.
TRICKY = [
    "👍🏽",
    "👩\u200d💻",
    "e\u0301",
    "東京",
    "שלום",
    "مرحبا",
    "\ufffd",
    "\ufeff",
    "\uffff",
    "\ue000",
    "\U0010fffd",
    "\U0001d11e",
    "'",
    '"',
    "\\",
    "\\u0000",
    "%",
    "_",
    "--",
    ";",
    "{}",
    "[]",
    "$x",
    "a.b",
    " ",
    "\u00a0",
    "\u3000",
    "Ω",
    "ß",
    "ﬁ",
]


def tricky_text(rng: random.Random, size: int) -> str:
    text = "".join(rng.choice(TRICKY) for _ in range(size))
    while len(text) > size:  # a pick may be longer than one character
        text = text[1:]
    return text or "x"


def tricky_orders(n: int, seed: int = 12) -> list[OrderData]:
    rng = random.Random(seed)
    orders = []
    for i in range(n):
        address = Address(
            name=tricky_text(rng, 200),
            line1=tricky_text(rng, rng.randint(1, 200)),
            city=tricky_text(rng, 30),
            postal_code=tricky_text(rng, 20),
            country="GB",
        )
        orders.append(
            order_data(f"o-tricky-{i}", customer_id=tricky_text(rng, 64), shipping_address=address)
        )
    return orders


async def test_every_value_validation_accepts_round_trips(store: StateStore) -> None:
    for data in tricky_orders(40):
        assert not unsafe_characters(data.customer_id)
        order, state = order_pair(data.order_id)
        order = OrderRecord.of(data, order.received_at)
        assert await store.insert_order(order, state) is InsertOutcome.CREATED
        assert await store.get_order(data.order_id) == order
        # The same data again is the same order (its fingerprint survived the round trip).
        assert await store.insert_order(order, state) is InsertOutcome.EXISTS


def _unvalidated_order(order_id: str, **data: object) -> OrderRecord:
    """An order as a writer that skipped validation would hand it over."""
    good = order_data(order_id)
    fields = {**good.__dict__, **data}
    raw = OrderData.model_construct(**fields)
    return OrderRecord.model_construct(data=raw, fingerprint="f" * 64, received_at=utcnow())


UNSTORABLE_EVENTS = {
    "NUL in a key": {"a\x00b": 1},
    "an integer beyond 64 bits": {"n": 2**64},
    "an unpaired surrogate": {"s": "\ud800"},
    "NaN": {"x": float("nan")},
}


@pytest.mark.parametrize("what", sorted(UNSTORABLE_EVENTS))
async def test_unstorable_journal_data_is_stored_exactly_or_refused(
    store: StateStore, what: str
) -> None:
    event = HistoryEvent.model_construct(
        order_id="o-v",
        type=HistoryEventType.STEP_FAILED,
        at=utcnow(),
        attempt=None,
        instance_id=None,
        step=None,
        data=UNSTORABLE_EVENTS[what],
        seq=None,
        schema_version=1,
    )
    await store.insert_order(*order_pair("o-v"))  # an order's journal is its record's
    try:
        await store.append_history(event)
    except StoreRefused as exc:  # anything else is a failure of the contract
        assert "refused" in str(exc)
        return
    (stored,) = await store.read_history("o-v")
    assert stored.data.keys() == event.data.keys()


async def test_nul_in_an_order_is_refused_by_postgresql_and_held_by_bson(
    store: StateStore,
) -> None:
    """Why validation refuses NUL: PostgreSQL cannot hold it in text, BSON can in values. The
    two stores disagree, so neither may ever be asked (test_models shows the refusal)."""
    order = _unvalidated_order("o-nul", customer_id="c\x00d")
    _, state = order_pair("o-nul")
    if store.kind == "postgresql":
        with pytest.raises(StoreRefused):
            await store.insert_order(order, state)
        assert await store.get_state("o-nul") is None
    else:
        assert await store.insert_order(order, state) is InsertOutcome.CREATED


async def test_an_order_written_before_the_text_rule_is_read_back_not_refused(
    store: StateStore,
) -> None:
    """Free text refuses control characters now; an order stored before that rule must still be
    read (and shown escaped), or `orders show` would fail on exactly the data to be shown."""
    order = _unvalidated_order("o-old", customer_id="\x1b]0;pwned\x07")
    _, state = order_pair("o-old")
    assert await store.insert_order(order, state) is InsertOutcome.CREATED
    stored = await store.get_order("o-old")
    assert stored is not None and stored.data.customer_id == "\x1b]0;pwned\x07"
