"""Message contracts shared by the producing and the consuming process (DESIGN §5-6).

JSON on the wire. Every body carries `schema_version`; the AMQP `type` property names the
contract. `decode` turns bytes into a contract or raises the `ContractViolation` that says why
the message must be dead-lettered.
"""

from __future__ import annotations

import json
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError

from shared.domain.journal import Alert
from shared.domain.models import OrderData, OrderId
from shared.domain.states import ErrorKind, ProcessState
from shared.errors import (
    InvalidMessage,
    MalformedMessage,
    MessageTooLarge,
    UnknownMessageType,
    UnsupportedSchemaVersion,
)

SCHEMA_VERSION = 1
QueueName = Annotated[str, StringConstraints(min_length=1, max_length=255)]
StepName = Annotated[str, StringConstraints(pattern=r"^[a-z][a-z0-9_-]{0,31}$")]


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
    fencing_token: Annotated[str, StringConstraints(min_length=1, max_length=100)]
    idempotency_key: Annotated[str, StringConstraints(min_length=1, max_length=140)]
    complete_by: datetime
    attempts_allowed: int = Field(ge=1, le=1000)
    payload: dict[str, Any] = Field(default_factory=dict)
    reply_to: QueueName


class StepOutcome(StrEnum):
    OK = "ok"
    ERROR = "error"


class StepReply(Contract):
    """An agent's answer: ok, or a non-transient error. Transient failures get no reply."""

    message_type: ClassVar[MessageType] = MessageType.STEP_REPLY
    order_id: OrderId
    step: StepName
    action: StepAction
    fencing_token: Annotated[str, StringConstraints(min_length=1, max_length=100)]
    idempotency_key: Annotated[str, StringConstraints(min_length=1, max_length=140)]
    outcome: StepOutcome
    attempts_used: int = Field(ge=0)
    result: dict[str, Any] | None = None
    error_kind: ErrorKind | None = None
    error_message: Annotated[str, StringConstraints(max_length=2000)] | None = None


class OrderStatus(StrEnum):
    RECEIVED = "Received"
    PROCESSING = "Processing"
    COMPLETED = "Completed"
    FAILED = "Failed"
    COMPENSATED = "Compensated"


class OrderStatusUpdate(Contract):
    """A status report to the submitting application's private reply queue."""

    message_type: ClassVar[MessageType] = MessageType.ORDER_STATUS
    order_id: OrderId
    status: OrderStatus
    process_state: ProcessState
    at: datetime
    detail: Annotated[str, StringConstraints(max_length=2000)] | None = None


class AlertMessage(Contract):
    message_type: ClassVar[MessageType] = MessageType.ALERT
    alert: Alert


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
    """Parse and validate a message body against the contract its `type` names."""
    if len(body) > max_bytes:
        raise MessageTooLarge(f"body of {len(body)} bytes exceeds the limit of {max_bytes}")
    try:
        kind = MessageType(type_name or "")
    except ValueError:
        raise UnknownMessageType(f"no contract for message type {type_name!r}") from None
    try:
        raw = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise MalformedMessage(f"body is not JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise MalformedMessage("body is not a JSON object")
    version = raw.get("schema_version")
    if version not in SUPPORTED_SCHEMA_VERSIONS[kind]:
        raise UnsupportedSchemaVersion(
            f"{kind} schema_version {version!r} is not one of "
            f"{sorted(SUPPORTED_SCHEMA_VERSIONS[kind])}"
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
    parts = [f"{'.'.join(str(p) for p in loc) or 'body'}: {msg}" for loc, msg in problems[:limit]]
    more = len(problems) - limit
    suffix = f" (+{more} more)" if more > 0 else ""
    return "; ".join(parts) + suffix
