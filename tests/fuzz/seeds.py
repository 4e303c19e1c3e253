"""The fuzzer's seed corpus, generated at run time (`fuzz_decode.py --make-corpus DIR`).

Valid messages of every contract (the samples of tests/support/bodies.py, compact and spaced,
and variants that fill the optional fields), each sample with every textual trick applied, the
examples of the intake issue (tests/unit/test_decode_properties.py), and the kept inputs of
tests/fuzz/regressions/. Files are named by their digest, as libFuzzer names its own.
"""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime
from pathlib import Path

from shared.domain.journal import Alert, AlertKind, Severity
from shared.domain.messages import (
    AlertMessage,
    Contract,
    OrderStatus,
    OrderStatusUpdate,
    StepAction,
    StepOutcome,
    StepReply,
    StepRequest,
    SubmitOrder,
)
from shared.domain.states import ErrorKind, ProcessState
from tests.fuzz.decode_check import join
from tests.support.bodies import SAMPLES, TRICKS, sample_contracts
from tests.unit.test_decode_properties import ISSUE_EXAMPLES

REGRESSIONS = Path(__file__).parent / "regressions"
NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def variants() -> list[Contract]:
    """Valid messages with the optional fields the samples leave out."""
    submit, request, reply, status, _ = sample_contracts("o-9.x_Y")
    assert isinstance(submit, SubmitOrder) and isinstance(request, StepRequest)
    assert isinstance(reply, StepReply) and isinstance(status, OrderStatusUpdate)
    return [
        submit.model_copy(update={"reply_to": None}),
        request.model_copy(
            update={"action": StepAction.UNDO, "payload": {"a": [1, 2.5, None, True, {"b": "c"}]}}
        ),
        reply.model_copy(
            update={
                "outcome": StepOutcome.ERROR,
                "result": None,
                "error_kind": ErrorKind.PERMANENT,
                "error_message": "card declined",
            }
        ),
        status.model_copy(
            update={
                "status": OrderStatus.FAILED,
                "process_state": ProcessState.ERROR,
                "detail": "payment: declined",
            }
        ),
        AlertMessage(
            alert=Alert(
                alert_id="poison:q:m-1",
                kind=AlertKind.POISON_MESSAGE,
                severity=Severity.CRITICAL,
                message="a message was dead-lettered",
                at=NOW,
                order_id="o-1",
                source="scheduler-1",
                data={"queue": "h.orders", "count": 3, "nested": {"x": [1, -2.5e-3, None]}},
            )
        ),
    ]


def seed_messages() -> list[tuple[str | None, bytes]]:
    seeds: list[tuple[str | None, bytes]] = []
    for contract in [*sample_contracts(), *variants()]:
        doc = contract.model_dump(mode="json")
        kind = contract.message_type.value
        seeds += [(kind, contract.to_json()), (kind, json.dumps(doc, indent=1).encode())]
    for kind, doc in SAMPLES.items():
        body = json.dumps(doc).encode()
        for name in sorted(TRICKS):
            seeds += [(kind, bytes(TRICKS[name](body, n))) for n in (1, 37, 3000)]
    seeds += ISSUE_EXAMPLES
    seeds += [("order.submit", b"[" * 4000 + b"]" * 4000), ("alert", b'{"a":' * 40 + b"}" * 40)]
    return seeds


def write_corpus(directory: Path) -> int:
    """Write the seeds into `directory` (made if need be); how many distinct ones."""
    directory.mkdir(parents=True, exist_ok=True)
    inputs = {join(kind, body) for kind, body in seed_messages()}
    inputs |= {path.read_bytes() for path in REGRESSIONS.iterdir() if path.is_file()}
    for data in inputs:
        (directory / hashlib.sha1(data).hexdigest()).write_bytes(data)
    return len(inputs)
