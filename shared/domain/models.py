"""Order and state records (DESIGN §3). Pure data: no I/O here."""

from __future__ import annotations

import hashlib
import json
from datetime import datetime
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationInfo,
)

from shared.domain.redaction_text import holds_card_number, shows_card_number
from shared.domain.states import ErrorKind, ProcessState, StepStatus
from shared.domain.text import STORED as STORED_KEY
from shared.domain.text import clean_cut, is_stored, refuse_unsafe

RECORD_SCHEMA_VERSION = 1
"""Version of the order and state record layout written by this build."""

# An order id must never contain ':' because the attempt-specific instance id is `<order_id>:<n>`.
APP_ORDER_ID = r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}"
AppOrderId = Annotated[str, StringConstraints(pattern=rf"^{APP_ORDER_ID}$")]
"""An order's id as its application gave it (and is told it in status messages)."""
OrderId = Annotated[str, StringConstraints(pattern=rf"^([a-z][a-z0-9_-]{{0,39}}/)?{APP_ORDER_ID}$")]
"""An order's id in the system: where applications are told apart by their broker users, the
application's own id prefixed with its name (`shop/o-1`), so that each application's ids are
its own and no other can take one first (services/submission); else the application's id."""


def scoped(app: str, order_id: str) -> str:
    """The system's id of an application's order."""
    return f"{app}/{order_id}"


def unscoped(order_id: str) -> str:
    """The application's own id of an order (what its status messages carry)."""
    return order_id.rpartition("/")[2]


STORED: dict[str, Any] = {STORED_KEY: True}
"""The validation context of a record read back from a store: what it holds was accepted when
it was written, under the rules of its day, and is read as it is (and shown escaped)."""


NO_CARD_NUMBERS = (
    "holds a card number: payment details are never accepted here, only a payment token from "
    "the payment provider"
)


def _free_text(value: str, info: ValidationInfo) -> str:
    if is_stored(info):
        return value
    if holds_card_number(value):
        raise ValueError(NO_CARD_NUMBERS)
    return refuse_unsafe(value)


def _not_a_card_number(value: str, info: ValidationInfo) -> str:
    """An identifier (an order id, a payment token) refuses a card number that stands apart in
    it (`o-4111111111111111`, `tok_4111…`): what every view would mask, so an accepted order's
    ids are shown as they are. Not one beside a letter: random hex ids hold such runs by
    chance (shared/domain/redaction_text.py `shown_text`)."""
    if not is_stored(info) and shows_card_number(value):
        raise ValueError(NO_CARD_NUMBERS)
    return value


NOT_A_CARD_NUMBER = AfterValidator(_not_a_card_number)
"""The check of an identifier of an order: not a card number."""


# Free text is what a person typed: any language, but no character that drives a terminal or
# that a store cannot hold (shared/domain/text.py), and no card number (shared/domain/
# redaction.py: payment details are never stored in clear); such an order is refused at
# validation.
ShortText = Annotated[
    str, StringConstraints(min_length=1, max_length=200), AfterValidator(_free_text)
]
CustomerId = Annotated[
    str, StringConstraints(min_length=1, max_length=64), AfterValidator(_free_text)
]
PostalCode = Annotated[
    str, StringConstraints(min_length=1, max_length=20), AfterValidator(_free_text)
]
ERROR_TEXT_LIMIT = 2000
ErrorText = Annotated[
    str,
    BeforeValidator(clean_cut(ERROR_TEXT_LIMIT)),
    StringConstraints(max_length=ERROR_TEXT_LIMIT),
]
"""An error's text: made from exceptions, which may quote anything, so it is cleaned and cut to
the limit at construction instead of refused (a long or odd error never makes a write fail)."""
Sku = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9._-]{1,64}$")]
Currency = Annotated[str, StringConstraints(pattern=r"^[A-Z]{3}$")]
# Payment details are never stored in clear: the front end hands over a token from the payment
# provider (issue 6 adds redaction of anything else).
PaymentToken = Annotated[
    str,
    StringConstraints(pattern=r"^tok_[A-Za-z0-9_-]{1,60}$"),
    NOT_A_CARD_NUMBER,
]


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, frozen=True, extra="forbid")


class OrderLine(_Strict):
    sku: Sku
    quantity: int = Field(ge=1, le=10_000)
    unit_price_cents: int = Field(ge=0, le=100_000_000)


class Address(_Strict):
    name: ShortText
    line1: ShortText
    city: ShortText
    postal_code: PostalCode
    country: Annotated[str, StringConstraints(pattern=r"^[A-Z]{2}$")]


class OrderData(_Strict):
    """The immutable data of an order, as the front end submits it."""

    order_id: Annotated[OrderId, NOT_A_CARD_NUMBER]
    customer_id: CustomerId
    lines: list[OrderLine] = Field(min_length=1, max_length=100)
    currency: Currency
    payment_token: PaymentToken
    shipping_address: Address

    @property
    def total_cents(self) -> int:
        return sum(line.quantity * line.unit_price_cents for line in self.lines)

    def fingerprint(self) -> str:
        """A digest of the immutable data: two submissions match iff their fingerprints do."""
        canonical = json.dumps(self.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()


class OrderRecord(_Strict):
    """The stored order: its immutable data and when it was first recorded."""

    data: OrderData
    fingerprint: str
    received_at: datetime
    schema_version: int = RECORD_SCHEMA_VERSION

    @classmethod
    def of(cls, data: OrderData, received_at: datetime) -> OrderRecord:
        return cls(data=data, fingerprint=data.fingerprint(), received_at=received_at)

    @property
    def order_id(self) -> str:
        return self.data.order_id


class ErrorInfo(_Strict):
    kind: ErrorKind
    message: ErrorText
    at: datetime


class StepState(_Strict):
    status: StepStatus = StepStatus.NOT_STARTED
    attempts: int = Field(default=0, ge=0)
    """Requests sent for this step across all attempts of the order."""
    allowance: int = Field(default=0, ge=0)
    """Remote attempts reserved from the retry budget for the request in flight."""
    started_at: datetime | None = None
    completed_at: datetime | None = None
    result: dict[str, Any] | None = None
    error: ErrorInfo | None = None


class RetryBudget(_Strict):
    """Remote attempts an order may spend across agent retries and supervisor recoveries."""

    limit: int = Field(ge=0)
    used: int = Field(default=0, ge=0)

    @property
    def remaining(self) -> int:
        return max(0, self.limit - self.used)

    @property
    def exhausted(self) -> bool:
        return self.used >= self.limit

    def spend(self, attempts: int) -> RetryBudget:
        if attempts < 0:
            raise ValueError("cannot spend a negative number of attempts")
        return self.model_copy(update={"used": self.used + attempts})


class StateRecord(_Strict):
    """The mutable state of one order; every change to it is conditional (DESIGN §3-4)."""

    order_id: OrderId
    process_state: ProcessState
    locked_by: Annotated[str, StringConstraints(max_length=128)] | None = None
    """The attempt-specific instance id `<order_id>:<attempt>.<nonce>` (shared/domain/identity.py)
    while an attempt holds it."""
    owner: Annotated[str, StringConstraints(max_length=200)] | None = None
    """The scheduler process running the current attempt (for operators; not a fence)."""
    complete_by: datetime | None = None
    failure_count: int = Field(default=0, ge=0)
    attempt: int = Field(default=0, ge=0)
    workflow: Annotated[str, StringConstraints(min_length=1, max_length=64)]
    workflow_version: int = Field(ge=1)
    schema_version: int = RECORD_SCHEMA_VERSION
    steps: dict[str, StepState]
    retry_budget: RetryBudget
    reply_to: Annotated[str, StringConstraints(max_length=255)] | None = None
    """The submitter's status queue (an AMQP name: at most 255 characters)."""
    next_attempt_at: datetime
    error: ErrorInfo | None = None
    created_at: datetime
    updated_at: datetime

    def step(self, name: str) -> StepState:
        return self.steps[name]


# Fields of the state record whose value a conditional update may set. `order_id`, `created_at`
# and `schema_version` never change after the insert.
MUTABLE_STATE_FIELDS = frozenset(StateRecord.model_fields) - {
    "order_id",
    "created_at",
    "schema_version",
}
