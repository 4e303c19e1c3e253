"""Message bodies from anyone: hypothesis strategies shared by the decode properties, the
consumer's search against the real servers, and the fuzzer's seed corpus.

`hostile_messages()` draws a (type, body) pair from every class the intake issue lists — any
bytes, any JSON, documents shaped like a contract with one part replaced, deleted or added,
and textual tricks (duplicate keys, deep nesting, huge integers and floats, NUL and other
control characters, unpaired surrogates, other encodings, a byte order mark) — and valid
messages among them, so that the search also proves good messages still pass.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from hypothesis import strategies as st

from shared.domain.journal import Alert, AlertKind, Severity
from shared.domain.messages import (
    CONTRACTS,
    AlertMessage,
    Contract,
    MessageType,
    OrderStatus,
    OrderStatusUpdate,
    StepAction,
    StepOutcome,
    StepReply,
    StepRequest,
    SubmitOrder,
    decode,
)
from shared.domain.models import Address, OrderData, OrderLine
from shared.domain.states import ProcessState
from shared.domain.text import unsafe_characters
from shared.errors import ContractViolation
from tests.support.factories import order_data

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
TYPES = [t.value for t in MessageType]


def sample_contracts(order_id: str = "o-1") -> list[Contract]:
    """One valid message of every contract."""
    order = order_data(order_id)
    return [
        SubmitOrder(order=order, reply_to="h.status.shop.abc"),
        StepRequest(
            order_id=order_id,
            step="charge",
            action=StepAction.DO,
            operation="payment.charge",
            fencing_token=f"{order_id}:1",
            idempotency_key=f"{order_id}:charge",
            complete_by=NOW,
            attempts_allowed=3,
            payload={"amount_cents": 2500},
            reply_to="h.reply.s1.abc",
        ),
        StepReply(
            order_id=order_id,
            step="charge",
            action=StepAction.DO,
            fencing_token=f"{order_id}:1",
            idempotency_key=f"{order_id}:charge",
            outcome=StepOutcome.OK,
            attempts_used=1,
            result={"charge_id": "ch_1"},
        ),
        OrderStatusUpdate(
            order_id=order_id,
            status=OrderStatus.COMPLETED,
            process_state=ProcessState.PROCESSED,
            at=NOW,
        ),
        AlertMessage(
            alert=Alert(
                alert_id="a-1",
                kind=AlertKind.ORDER_ERROR,
                severity=Severity.WARNING,
                message="m",
                at=NOW,
            )
        ),
    ]


SAMPLES = {c.message_type.value: c.model_dump(mode="json") for c in sample_contracts()}

# -- JSON values of every kind, including the ones no store can hold
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=-(10**30), max_value=10**30),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(),
    st.sampled_from(["", "\x00", "\x1b]0;pwned\x07", "\u202e", "\ud800", "tok_x", "o-1", "1"]),
)
json_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)


def _paths(doc: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    paths = [prefix]
    if isinstance(doc, dict):
        for key, value in doc.items():
            paths += _paths(value, (*prefix, key))
    elif isinstance(doc, list):
        for i, value in enumerate(doc):
            paths += _paths(value, (*prefix, i))
    return paths


def _replace(doc: Any, path: tuple[Any, ...], value: Any) -> Any:
    if not path:
        return value
    head, rest = path[0], path[1:]
    if isinstance(doc, dict):
        return {**doc, head: _replace(doc[head], rest, value)}
    copy = list(doc)
    copy[head] = _replace(doc[head], rest, value)
    return copy


def _delete(doc: Any, path: tuple[Any, ...]) -> Any:
    if len(path) == 1:
        if isinstance(doc, dict):
            return {k: v for k, v in doc.items() if k != path[0]}
        return [v for i, v in enumerate(doc) if i != path[0]]
    head = path[0]
    if isinstance(doc, dict):
        return {**doc, head: _delete(doc[head], path[1:])}
    copy = list(doc)
    copy[head] = _delete(doc[head], path[1:])
    return copy


@st.composite
def contract_shaped(draw: st.DrawFn) -> tuple[str, Any]:
    """A valid document of some contract with one part replaced, deleted, or added to."""
    type_name = draw(st.sampled_from(TYPES))
    doc: Any = SAMPLES[type_name]
    path = draw(st.sampled_from(_paths(doc)))
    how = draw(st.sampled_from(["replace", "delete", "add", "keep"]))
    if how == "replace":
        doc = _replace(doc, path, draw(json_values))
    elif how == "delete" and path:
        doc = _delete(doc, path)
    elif how == "add":
        doc = {**doc, draw(st.text(max_size=12)): draw(json_values)}
    return type_name, doc


def _dump(doc: Any) -> bytes:
    # ensure_ascii: unpaired surrogates travel as \ud800 escapes, as a hostile sender's would.
    return json.dumps(doc, allow_nan=True).encode()


def _deep_object(body: bytes, depth: int) -> bytes:
    return body[:-1] + b',"x":' + b'{"a":' * depth + b"1" + b"}" * depth + b"}"


TRICKS: dict[str, Any] = {
    "duplicate": lambda body, n: b'{"schema_version":1,' + body[1:],
    "deep": _deep_object,
    "deep-list": lambda body, n: b"[" * n + b"]" * n,
    "bigint": lambda body, n: body.replace(
        b'"schema_version": 1', b'"schema_version": 1' + b"9" * (n * 2 + 19), 1
    ),
    "bigfloat": lambda body, n: body.replace(b'"schema_version": 1', b'"schema_version": 1e999'),
    "nan": lambda body, n: body[:-1] + b', "x": NaN}',
    "nul": lambda body, n: body.replace(b'"c-42"', b'"c\\u0000-42"').replace(
        b'"o-1"', b'"o\\u0000"', 1
    ),
    "bom": lambda body, n: b"\xef\xbb\xbf" + body,
    "utf16": lambda body, n: body.decode().encode("utf-16"),
    "latin1": lambda body, n: body.replace(b"Ada", "Adà".encode("latin-1")),
    "truncate": lambda body, n: body[: n % (len(body) + 1)],
    "trailing": lambda body, n: body + [b" x", b"}", b"\x00", b" {}"][n % 4],
    "surrogate-key": lambda body, n: body[:-1] + b', "\\udc80": 1}',
    "controls": lambda body, n: body.replace(
        b"Ada Lovelace", b"\\u001b]0;t\\u0007\\u009b2J\\u202e"
    ),
}
"""What no JSON serializer of a dict produces, applied to a valid body (n: a drawn size)."""


@st.composite
def textual_tricks(draw: st.DrawFn) -> tuple[str, bytes]:
    type_name = draw(st.sampled_from(TYPES))
    trick = TRICKS[draw(st.sampled_from(sorted(TRICKS)))]
    n = draw(st.integers(min_value=1, max_value=3000))
    return type_name, bytes(trick(_dump(SAMPLES[type_name]), n))


type_names = st.one_of(
    st.sampled_from(TYPES), st.none(), st.text(max_size=300), st.sampled_from(["\x00", "alert "])
)


def hostile_messages() -> st.SearchStrategy[tuple[str | None, bytes]]:
    """Any (type, body) pair: mostly bad, some valid."""
    return st.one_of(
        st.tuples(type_names, st.binary(max_size=512)),
        st.tuples(st.sampled_from(TYPES), json_values.map(_dump)),
        contract_shaped().map(lambda pair: (pair[0], _dump(pair[1]))),
        textual_tricks(),
        st.sampled_from([(t, _dump(d)) for t, d in SAMPLES.items()]),
    )


# -- valid orders with free text from anywhere in Unicode (but the unsafe characters)
safe_text = st.text(min_size=1, max_size=40).filter(lambda s: not unsafe_characters(s))


@st.composite
def valid_orders(draw: st.DrawFn, order_id: str | None = None) -> OrderData:
    oid = order_id or draw(st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._-]{0,20}", fullmatch=True))
    return OrderData(
        order_id=oid,
        customer_id=draw(safe_text),
        lines=[
            OrderLine(
                sku=draw(st.from_regex(r"[A-Za-z0-9._-]{1,12}", fullmatch=True)),
                quantity=draw(st.integers(1, 10_000)),
                unit_price_cents=draw(st.integers(0, 100_000_000)),
            )
        ],
        currency="EUR",
        payment_token="tok_visa_4242",
        shipping_address=Address(
            name=draw(safe_text),
            line1=draw(safe_text),
            city=draw(safe_text),
            postal_code=draw(safe_text.filter(lambda s: len(s) <= 20)),
            country="GB",
        ),
    )


def contract_of(type_name: str) -> type[Contract]:
    return CONTRACTS[MessageType(type_name)]


def type_property(type_name: str | None) -> str | None:
    """AMQP's type property holds 255 bytes at most: a longer one is cut (a client library
    refuses to send more)."""
    if type_name is None:
        return None
    return type_name.encode("utf-8", "surrogatepass")[:255].decode("utf-8", "ignore") or None


def expected_outcome(type_name: str | None, body: bytes) -> str:
    """What submission must do with a message: the reason of its dead letter, or `handled`
    (a valid order: recorded, or, if another order holds its id, dead-lettered `conflict`)."""
    try:
        contract = decode(type_name, body, max_bytes=64 * 1024)
    except ContractViolation as exc:
        return exc.reason
    return "handled" if isinstance(contract, SubmitOrder) else "wrong-type"
