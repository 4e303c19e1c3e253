"""Message contracts shared by the producing and the consuming process (DESIGN §5-6).

JSON on the wire. Every body carries `schema_version`; the AMQP `type` property names the
contract. `decode` turns bytes into a contract or raises the `ContractViolation` that says why
the message must be dead-lettered.
"""

from __future__ import annotations

import json
from enum import StrEnum
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    field_validator,
)

from shared.domain import jsonsafe
from shared.domain.journal import Alert
from shared.domain.models import AppOrderId, ErrorText, OrderData, OrderId
from shared.domain.states import ErrorKind, ProcessState
from shared.domain.text import cut, printable, refuse_unsafe
from shared.domain.timing import in_range
from shared.errors import (
    ContractViolation,
    InvalidMessage,
    MalformedMessage,
    MessageTooLarge,
    UndecodableMessage,
    UnknownMessageType,
    UnsupportedSchemaVersion,
)

SCHEMA_VERSION = 1
QueueName = Annotated[
    str, StringConstraints(min_length=1, max_length=255), AfterValidator(refuse_unsafe)
]
Token = Annotated[str, StringConstraints(pattern=r"^[\x21-\x7e]{1,200}$")]
"""A fencing token or an idempotency key: printable ASCII (`<order_id>:<attempt>.<nonce>`)."""
Timestamp = Annotated[AwareDatetime, AfterValidator(in_range)]
"""A time on the wire: with its offset (a naive time cannot be compared with the clock), and
within the years every store and every deadline computation can hold."""
JsonObject = Annotated[dict[str, Any], AfterValidator(jsonsafe.storable)]
"""Free-form JSON that both stores hold alike (shared/domain/jsonsafe.py)."""
StepName = Annotated[str, StringConstraints(pattern=r"^[a-z][a-z0-9_-]{0,31}$")]
FenceSignature = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]
"""An HMAC-SHA256 in hex: a fencing token's signature."""


class MessageType(StrEnum):
    SUBMIT_ORDER = "order.submit"
    STEP_REQUEST = "step.request"
    STEP_REPLY = "step.reply"
    ORDER_STATUS = "order.status"
    ALERT = "alert"


class Contract(BaseModel):
    model_config = ConfigDict(strict=True, frozen=True, extra="forbid")
    message_type: ClassVar[MessageType]
    schema_version: Literal[1] = 1

    def to_json(self) -> bytes:
        return self.model_dump_json().encode()


class SubmitOrder(Contract):
    """A front end asks for an order to be processed."""

    message_type: ClassVar[MessageType] = MessageType.SUBMIT_ORDER
    order: OrderData
    reply_to: QueueName | None = None

    @field_validator("order")
    @classmethod
    def _own_id(cls, order: OrderData) -> OrderData:
        if "/" in order.order_id:
            raise ValueError(
                "an order id is the application's own, without '/' (where applications are "
                "told apart, the system prefixes it with the application's name)"
            )
        return order


class StepAction(StrEnum):
    DO = "do"
    UNDO = "undo"


class StepRequest(Contract):
    """The scheduler asks an agent to run one step (or its undo) for one attempt."""

    message_type: ClassVar[MessageType] = MessageType.STEP_REQUEST
    order_id: OrderId
    step: StepName
    action: StepAction
    operation: Annotated[str, StringConstraints(pattern=r"^[a-z]+\.[a-z_]+$")]
    fencing_token: Annotated[Token, StringConstraints(max_length=120)]
    idempotency_key: Token
    complete_by: Timestamp
    attempts_allowed: int = Field(ge=1, le=1000)
    payload: JsonObject = Field(default_factory=dict)
    reply_to: QueueName
    fencing_signature: FenceSignature | None = None
    """The scheduler's signature of `fencing_token` (shared/remote/fencing.py), which the
    agent passes on to the remote service: only with it does the remote accept the token. None
    from a scheduler without a fence key, or from before signatures (schema version 1 either
    way: the field is optional, so a request of an older scheduler still decodes; the remote
    refuses its call, and the step is given back for an attempt that signs)."""


class StepOutcome(StrEnum):
    OK = "ok"
    ERROR = "error"


class StepReply(Contract):
    """An agent's answer: ok, or a non-transient error. Transient failures get no reply."""

    message_type: ClassVar[MessageType] = MessageType.STEP_REPLY
    order_id: OrderId
    step: StepName
    action: StepAction
    fencing_token: Annotated[Token, StringConstraints(max_length=120)]
    idempotency_key: Token
    outcome: StepOutcome
    attempts_used: int = Field(ge=0, le=1000)
    result: JsonObject | None = None
    error_kind: ErrorKind | None = None
    error_message: ErrorText | None = None


class OrderStatus(StrEnum):
    RECEIVED = "Received"
    PROCESSING = "Processing"
    COMPLETED = "Completed"
    FAILED = "Failed"
    COMPENSATED = "Compensated"
    CANCELLED = "Cancelled"


class OrderStatusUpdate(Contract):
    """A status report to the submitting application's private reply queue."""

    message_type: ClassVar[MessageType] = MessageType.ORDER_STATUS
    order_id: AppOrderId
    status: OrderStatus
    process_state: ProcessState
    at: Timestamp
    detail: ErrorText | None = None


def _receivable_alert(alert: Alert) -> Alert:
    """A received alert is stored as it is, so it keeps the rules of the other contracts, which
    the journal's `Alert` (built by the system itself) does not enforce: its time is a wire
    `Timestamp` (with its offset, within the years of `timing.in_range`), and all of it is what
    every store holds alike — the journal cleans the text of its free-form `data` but bounds
    neither its keys (`$x`, `a.b`, an empty one) nor its numbers, nor the `schema_version`."""
    if alert.at.utcoffset() is None:
        raise ValueError("at: a time without its offset")
    try:
        in_range(alert.at)
    except ValueError as exc:
        raise ValueError(f"at: {exc}") from None
    jsonsafe.storable(alert.model_dump(mode="json"))
    return alert


class AlertMessage(Contract):
    message_type: ClassVar[MessageType] = MessageType.ALERT
    alert: Annotated[Alert, AfterValidator(_receivable_alert)]


Message = SubmitOrder | StepRequest | StepReply | OrderStatusUpdate | AlertMessage

CONTRACTS: dict[MessageType, type[Contract]] = {
    MessageType.SUBMIT_ORDER: SubmitOrder,
    MessageType.STEP_REQUEST: StepRequest,
    MessageType.STEP_REPLY: StepReply,
    MessageType.ORDER_STATUS: OrderStatusUpdate,
    MessageType.ALERT: AlertMessage,
}
SUPPORTED_SCHEMA_VERSIONS: dict[MessageType, frozenset[int]] = {
    kind: frozenset({SCHEMA_VERSION}) for kind in CONTRACTS
}


def decode(type_name: str | None, body: bytes, *, max_bytes: int) -> Contract:
    """Parse and validate a message body against the contract its `type` names.

    Total over its inputs: any `type_name` and any `body` either decode or raise one
    `ContractViolation` saying why (tests/unit/test_decode_properties.py searches for a
    counterexample, tests/fuzz/ keeps searching). The last clause is a net, not a path: a
    failure that reaches it is a bug in the checks before it, and says so in its reason."""
    try:
        return _decode(type_name, body, max_bytes=max_bytes)
    except ContractViolation:
        raise
    except Exception as exc:
        raise UndecodableMessage(
            f"body could not be read ({type(exc).__name__}); an orderflow bug, please report it"
        ) from None


def _decode(type_name: str | None, body: bytes, *, max_bytes: int) -> Contract:
    if len(body) > max_bytes:
        raise MessageTooLarge(f"body of {len(body)} bytes exceeds the limit of {max_bytes}")
    try:
        kind = MessageType(type_name or "")
    except ValueError:
        shown = printable(cut(type_name or "", 80))
        raise UnknownMessageType(f"no contract for message type {shown!r}") from None
    raw = jsonsafe.parse(body)
    if not isinstance(raw, dict):
        raise MalformedMessage(f"body is a JSON {type(raw).__name__}, not an object")
    version = raw.get("schema_version")
    # `type(...) is int`: JSON's true and 1.0 are not the version 1 (Python finds them equal).
    if type(version) is not int or version not in SUPPORTED_SCHEMA_VERSIONS[kind]:
        shown = printable(cut(json.dumps(version), 40))
        raise UnsupportedSchemaVersion(
            f"{kind} schema_version {shown} is not one of {sorted(SUPPORTED_SCHEMA_VERSIONS[kind])}"
        )
    try:
        return CONTRACTS[kind].model_validate_json(body)
    except ValidationError as exc:
        raise InvalidMessage(_summarise(exc)) from None


def validation_problems(exc: ValidationError) -> list[tuple[tuple[str | int, ...], str]]:
    """Every (location, message) of a validation error, sorted by location: the same text
    whatever order a pydantic release reports them in."""
    problems = [(tuple(err["loc"]), str(err["msg"])) for err in exc.errors()]
    return sorted(problems, key=lambda p: ([str(part) for part in p[0]], p[1]))


def _summarise(exc: ValidationError, limit: int = 5) -> str:
    problems = validation_problems(exc)
    # A location may be a key the sender chose: shown escaped and cut, like all received text.
    parts = [
        f"{printable(cut('.'.join(str(p) for p in loc), 80)) or 'body'}: {printable(msg)}"
        for loc, msg in problems[:limit]
    ]
    more = len(problems) - limit
    suffix = f" (+{more} more)" if more > 0 else ""
    return "; ".join(parts) + suffix
