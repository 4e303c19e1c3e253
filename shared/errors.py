"""One error hierarchy for every orderflow process.

The broker adapter maps these to what happens to a message (the table in
shared/broker/consumer.py): a `ServiceUnavailable` or `PublishError` is an outage that holds the
message, a `PermanentError` (a `ContractViolation`, a `StoreRefused`) dead-letters it at once
with its reason, and anything else is set aside for a delayed retry.
"""

from __future__ import annotations


class OrderflowError(Exception):
    """Base of every error orderflow raises on purpose."""


class TransientError(OrderflowError):
    """A failure that may succeed if retried later: retry me."""


class PermanentError(OrderflowError):
    """A failure that will not go away by retrying: do not retry (a consumer dead-letters the
    message that caused it at once, with `reason`)."""

    reason: str = "permanent"


class ContractViolation(PermanentError):
    """A message or record that breaks its contract: dead-letter it with this reason."""

    reason: str = "invalid"

    def __init__(self, message: str, *, reason: str | None = None) -> None:
        super().__init__(message)
        if reason is not None:
            self.reason = reason


class MalformedMessage(ContractViolation):
    """A body that is not the JSON object its content type promises."""

    reason = "malformed"


class UndecodableMessage(MalformedMessage):
    """A body whose reading failed in a way no check foresaw (a bug in the checks): still
    dead-lettered at once, never retried."""


class InvalidMessage(ContractViolation):
    """A well-formed body that fails its schema's validation."""

    reason = "invalid"


class UnknownMessageType(ContractViolation):
    """A message whose `type` no contract describes."""

    reason = "unknown-type"


class UnsupportedSchemaVersion(ContractViolation):
    """A message whose `schema_version` this build cannot read."""

    reason = "unsupported-schema-version"


class MessageTooLarge(ContractViolation):
    """A body larger than the configured limit."""

    reason = "too-large"


class IllegalTransition(PermanentError):
    """A state change the transition table does not allow."""


class PublishError(TransientError):
    """The broker did not take a message: the caller must know it was not sent."""


class PublishRejected(PublishError):
    """The broker refused a message (negative confirm), e.g. a full queue with reject-publish."""


class PublishUnroutable(PublishError):
    """The broker returned a mandatory message that no queue was bound to receive."""


class ConfigurationError(OrderflowError):
    """A setting that cannot be used as given (a malformed URL, an unknown store scheme)."""


class ServiceUnavailable(TransientError):
    """A server orderflow depends on cannot be reached."""


class StoreUnavailable(ServiceUnavailable):
    """The state store dropped the connection or refuses connections (e.g. it is restarting):
    hold the work and retry; do not count it against a message's redelivery limit."""


class StoreRefused(PermanentError):
    """The store refused a value it cannot hold (a character, a number out of its range): the
    same write fails the same way every time, so its message is dead-lettered at once."""

    reason = "store-refused"


def one_line(exc: BaseException, limit: int = 300) -> str:
    """An exception as one short line, for an operator's terminal."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= limit else text[: limit - 1] + "…"
