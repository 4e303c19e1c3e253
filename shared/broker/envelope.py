"""A received message's envelope, read defensively, and the copies the consumer publishes of it.

Everything in an AMQP message is the sender's choice, not only its body: a property may hold
bytes that are not UTF-8 (pamqp then hands over `bytes`, not `str`), a header may hold a value
the client library cannot encode again (bytes, again) or be large enough that our copy with
its own headers no longer fits in a frame — the broker then closes the whole connection. So:

- `Envelope.of` reads the properties a handler relies on as text or None, never raising;
- `carried_headers` keeps of the sender's headers only the few a copy needs (trace context,
  `CARRIED`), each within a size cap, and never a header of ours (`x-orderflow-…`): a dead
  letter's reason, source queue or sender is what this consumer says, not what the sender wrote;
- `dead_letter_copy` and `retry_copy` build the copies from those parts only; a dead letter is
  sealed (shared/broker/seal.py) so that a replay of it is accepted as what it was.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from shared.broker.port import Incoming, Outgoing
from shared.broker.seal import Sealed
from shared.broker.wire import UNDECODABLE_HEADERS, Undecodable, header_size
from shared.domain.redaction import redact_body, redact_headers, redact_text
from shared.domain.text import cut, is_safe, printable
from shared.domain.timing import utcnow

OURS = "x-orderflow-"
REASON = "x-orderflow-reason"
REDACTED = "x-orderflow-redacted"
"""Set on a dead letter whose body had payment details masked (shared/domain/redaction.py)."""
ERROR = "x-orderflow-error"
SOURCE_QUEUE = "x-orderflow-source-queue"
DEAD_LETTERED_AT = "x-orderflow-dead-lettered-at"
DELIVERIES = "x-orderflow-deliveries"
TARGET = "x-orderflow-target"
"""Set on the notifier's dead letter: the webhook that did not take it (services/notifier)."""
RETRIES = "x-orderflow-retries"
"""Delayed retries a message has had (set on the copy put in the retry queue)."""
SENDER = "x-orderflow-sender"
"""The original message's broker-checked `user_id`, carried through the retry queue and on a
dead letter (there sealed with it)."""
SEAL = "x-orderflow-seal"
"""A dead letter's seal (shared/broker/seal.py): what makes a replay of it acceptable."""
TRUNCATED = "x-orderflow-truncated"
"""Set on a dead letter whose body was cut to the size limit: the original size in bytes."""
HEADERS_DROPPED = "x-orderflow-headers-dropped"
"""The sender's headers left out of a copy: names, or `all` past the size budget."""

BROKERS = frozenset({"x-delivery-count", "CC", "BCC"})
"""Headers never copied: the broker's per-queue delivery count (meaningless in another queue),
and the sender-selected routing headers, with which the broker would deliver our copy to the
queues they name as well (a dead letter published to the direct dead-letter exchange with
`CC: <hub>.agent.payment` lands in the payment agent's DLQ too, and a replay of it would
reach the payment agent)."""
BROKER_WRITTEN = frozenset({"x-delivery-count", "x-acquired-count", "x-death"})
"""Headers only the broker writes: a quorum queue's counts of returns (RabbitMQ 4 adds the
acquired count) and its record of dead-lettering a message; with `x-first-death-…` and
`x-last-death-…` (`broker_written`)."""
CARRIED = frozenset({"traceparent", "tracestate"})
"""The sender's headers a copy carries (W3C trace context); no other, so no header a sender
chose can pass for something this system says, or grow a copy past a frame."""
HEADER_VALUE_LIMIT = 512
"""Characters of one carried header's value; a longer one is dropped."""
HEADER_BUDGET = 8 * 1024
"""Bytes of the sender's headers a copy carries at most: with ours it stays far below a
frame."""
CUT_MARGIN = 256
"""Bytes past the size limit a dead letter's body is masked with before its cut."""
ERROR_LIMIT = 1000
"""Characters of the error text a dead letter carries."""


def shown(value: object) -> str:
    """A property value as safe, short text for a log line or an error (bytes included)."""
    if isinstance(value, bytes):
        value = value.decode("utf-8", "backslashreplace")
    return printable(cut(str(value), 120)) if value is not None else "(none)"


def _text(value: object) -> str | None:
    """A property as text, or None when it is missing, not text, or unsafe to use."""
    if not isinstance(value, str) or not value or not is_safe(value):
        return None
    return value


def broker_written(name: object) -> bool:
    """Whether a header is one only the broker writes (`BROKER_WRITTEN`, `x-…-death-…`)."""
    if not isinstance(name, str):
        return False
    return name in BROKER_WRITTEN or (name.startswith("x-") and "-death-" in name)


def user_of(message: Incoming) -> str | None:
    """A message's broker-checked sender (`user_id`) as text, or None."""
    return _text(message.user_id)


@dataclass(frozen=True)
class Envelope:
    """The properties of a received message, each text or None."""

    message_id: str | None
    type: str | None
    correlation_id: str | None
    reply_to: str | None
    content_type: str | None
    user_id: str | None
    headers: dict[str, Any]
    raw_message_id: object
    """The message id as received, to say what was wrong with it."""
    undecodable: str | None = None
    """What of the properties could not be decoded (shared/broker/wire.py), if anything."""

    @classmethod
    def of(cls, message: Incoming) -> Envelope:
        headers: dict[str, Any] = dict(message.headers or {})
        undecodable = None
        if isinstance(headers.get(UNDECODABLE_HEADERS), Undecodable):  # not a sender's
            undecodable = f"a header table of {headers[UNDECODABLE_HEADERS]!r} bytes"
            headers = {}
        return cls(
            message_id=_text(message.message_id),
            type=_text(message.type),
            correlation_id=_text(message.correlation_id),
            reply_to=_text(message.reply_to),
            content_type=_text(message.content_type),
            user_id=user_of(message),
            headers=headers,
            raw_message_id=message.message_id,
            undecodable=undecodable,
        )

    def refusal(self) -> tuple[str, str] | None:
        """(reason, error) when the envelope alone refuses the message: nothing of it can be
        trusted to name, dedupe or route it."""
        if self.undecodable is not None:
            return (
                "invalid-properties",
                f"{self.undecodable} could not be decoded (not UTF-8, or out of range)",
            )
        if self.message_id is not None:
            return None
        if self.raw_message_id in (None, ""):
            return "missing-message-id", "no message_id"
        return (
            "invalid-message-id",
            f"message_id {shown(self.raw_message_id)} is not text without control characters",
        )

    def retries(self, limit: int, own_user: str | None) -> int:
        """Delayed retries so far, from our header on a copy of ours (0 on anything else: a
        sender cannot spend its own retries, nor get more)."""
        value = self.headers.get(RETRIES)
        if not self.ours(own_user) or isinstance(value, bool) or not isinstance(value, int):
            return 0
        return min(max(value, 0), limit)

    def set_by_sender(self, own_user: str | None, redelivered: bool) -> list[str]:
        """The headers only the broker writes that this message carries as its sender set
        them: on its first delivery (`redelivered` False) of anything but a copy of ours, every
        such header is the sender's (a copy of ours carries none but the broker's: every copy
        is made without them, and the retry queue adds its `x-death`)."""
        if redelivered or self.ours(own_user):
            return []
        return [name for name in self.headers if broker_written(name)]

    def ours(self, own_user: str | None) -> bool:
        """Whether this is a copy this consumer's process made (set aside or held through an
        outage): it carries our own `user_id`, which only we can set (the broker checks it),
        and our retry header."""
        return own_user is not None and self.user_id == own_user and RETRIES in self.headers

    def deliveries_before(self, own_user: str | None) -> int:
        """Deliveries earlier copies of the message counted, from our header on a copy of ours
        held through an outage (0 on anything else: a sender cannot lower its own count)."""
        value = self.headers.get(DELIVERIES)
        if not self.ours(own_user) or isinstance(value, bool) or not isinstance(value, int):
            return 0
        return max(value, 0)

    def sender(self, own_user: str | None) -> str | None:
        """Who published the message, as the broker checked it. A copy that came back from the
        retry queue carries our own `user_id` (which only we can set: the broker checks it) and
        the original sender in a header; anything else is its own `user_id` or unknown."""
        if self.ours(own_user):
            return _text(self.headers.get(SENDER))
        return self.user_id

    def sealed_sender(self, queue: str, body: bytes, key: bytes | None) -> str | None:
        """The sender a replayed dead letter's seal vouches for, or None when it has no seal
        that checks: made by this queue's consumer, over exactly this message."""
        sender = _text(self.headers.get(SENDER))
        sealed = self.sealed(queue, sender, body)
        if sender is None or sealed is None:
            return None
        return sender if sealed.checks(key, self.headers.get(SEAL)) else None

    def sealed(self, queue: str, sender: str | None, body: bytes) -> Sealed | None:
        """What a seal of this message covers (None: no sender or no id to seal)."""
        if sender is None or self.message_id is None:
            return None
        return Sealed(
            queue=queue,
            sender=sender,
            message_id=self.message_id,
            message_type=self.type,
            correlation_id=self.correlation_id,
            reply_to=self.reply_to,
            body=body,
        )


def carried_headers(headers: dict[str, Any]) -> dict[str, Any]:
    """The sender's headers a copy may carry: the allowed ones (`CARRIED`), text within the
    value cap, encodable, within the budget; the names of the rest in `HEADERS_DROPPED`."""
    kept: dict[str, Any] = {}
    dropped: list[str] = []
    size = 0
    for name, value in headers.items():
        if not isinstance(name, str) or name.startswith(OURS) or name in BROKERS:
            continue
        allowed = name in CARRIED and isinstance(value, str) and len(value) <= HEADER_VALUE_LIMIT
        encoded = header_size(name, value) if allowed else None
        if encoded is None or size + encoded > HEADER_BUDGET:
            dropped.append(printable(cut(name, 60)))
            continue
        size += encoded
        kept[name] = value
    if dropped:
        kept[HEADERS_DROPPED] = cut(", ".join(dropped), 500)
    return kept


def _properties(envelope: Envelope) -> dict[str, Any]:
    return {
        "message_id": envelope.message_id,
        "correlation_id": envelope.correlation_id,
        "reply_to": envelope.reply_to,
        "type": envelope.type,
        "content_type": envelope.content_type,
    }


def dead_letter_copy(
    message: Incoming,
    envelope: Envelope,
    *,
    reason: str,
    error: str,
    queue: str,
    deliveries: int,
    max_body: int,
    sender: str | None = None,
    seal_key: bytes | None = None,
    own_user: str | None = None,
) -> Outgoing:
    """What goes to the DLQ: the body redacted (and cut to `max_body`), our headers saying why,
    and who sent it, sealed with `seal_key` (when the message has an id to seal); the delayed
    retries it had when it is a copy of ours (`own_user`'s)."""
    # The sender's headers masked before they are carried (so the budget counts what is sent
    # and a dropped header's name is masked too); the body cut with room for a card number
    # that straddles the cut, masked, then cut to size (no digits of one left in clear).
    sender_headers, headers_masked = redact_headers(envelope.headers)
    headers = carried_headers(sender_headers)
    body = message.body
    if len(body) > max_body:
        headers[TRUNCATED] = len(body)
        body = body[: max_body + CUT_MARGIN]
    body, redacted = redact_body(body)
    body = body[:max_body]
    error = redact_text(error)
    headers |= {
        REASON: reason,
        ERROR: cut(printable(error), ERROR_LIMIT),
        SOURCE_QUEUE: queue,
        DEAD_LETTERED_AT: utcnow().isoformat(),
        DELIVERIES: deliveries,
    }
    retries = envelope.retries(2**31, own_user)  # a copy of ours: its delayed retries so far
    if retries:
        headers[RETRIES] = retries
    if redacted or headers_masked:
        headers[REDACTED] = True
    if sender is not None:
        headers[SENDER] = sender
    sealed = envelope.sealed(queue, sender, body)
    if sealed is not None and seal_key is not None:
        headers[SEAL] = sealed.seal(seal_key)
    return Outgoing(body, headers=headers, **_properties(envelope))


def retry_copy(
    message: Incoming,
    envelope: Envelope,
    *,
    retries: int,
    delay_s: float,
    error: str,
    own_user: str | None,
    sender: str | None,
    deliveries: int | None = None,
) -> Outgoing:
    """What is set aside in the retry queue: the message as it came, back after `delay_s`;
    `deliveries`, when given, the deliveries it has counted so far (a message held through an
    outage keeps its count; one set aside after a failure starts again, its retries bounded)."""
    headers = carried_headers(redact_headers(envelope.headers)[0]) | {
        RETRIES: retries,
        ERROR: cut(printable(error), ERROR_LIMIT),
    }
    if sender is not None:
        headers[SENDER] = sender
    if deliveries is not None:
        headers[DELIVERIES] = deliveries
    return Outgoing(
        message.body,
        headers=headers,
        expiration=delay_s,
        user_id=own_user,
        **_properties(envelope),
    )
