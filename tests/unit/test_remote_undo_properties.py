"""Properties of the remote stand-in's ledger (in memory): whatever order the calls of a step,
their repeats and its undo arrive in, under whichever fencing tokens, no effect is ever made
after its undo, an undo that finds an effect undoes it, and a key has one outcome."""

from __future__ import annotations

import contextlib
import random

from hypothesis import given
from hypothesis import strategies as st

from harness.remote.accounts import Accounts
from harness.remote.app import UNDO_OF, Faults, RemoteCall, RemoteService
from harness.remote.ledger import Ledger
from shared.errors import StaleFencingToken, Undone

STEPS = {
    "reserve": ("inventory.reserve", "inventory.release"),
    "charge": ("payment.charge", "payment.refund"),
}

call = st.tuples(
    st.sampled_from(sorted(STEPS)),
    st.booleans(),  # an undo, or the step itself
    st.integers(min_value=1, max_value=3),  # the attempt whose fencing token it carries
)


@given(st.lists(call, max_size=12))
def test_no_effect_follows_its_undo_and_an_undo_undoes_what_was_made(
    calls: list[tuple[str, bool, int]],
) -> None:
    service = RemoteService(
        Ledger(":memory:"), Faults(), random.Random(0), admin_token=None, accounts=Accounts()
    )
    try:
        for step, undo, attempt in calls:
            forward, undo_op = STEPS[step]
            body = RemoteCall(
                order_id="o-1",
                idempotency_key=f"o-1:{step}{':undo' if undo else ''}",
                fencing_token=f"o-1:{attempt}",
            )
            with contextlib.suppress(StaleFencingToken, Undone):  # refused: no effect
                service._apply("", undo_op if undo else forward, body)
        effects = service.ledger.effects_of("", "o-1")
    finally:
        service.ledger.close()
    assert len({e.idempotency_key for e in effects}) == len(effects), "one outcome per key"
    for forward, undo_op in STEPS.values():
        assert forward in UNDO_OF[undo_op]
        made = [e for e in effects if e.operation == forward and e.outcome == "applied"]
        undos = [e for e in effects if e.operation == undo_op]
        if not undos:
            continue
        [undone] = undos
        assert all(e.seq < undone.seq for e in made), "an effect made after its undo"
        if made:
            assert (undone.outcome, undone.result["undid"]) == ("applied", made[0].seq)
        else:
            assert undone.outcome == "noop"
