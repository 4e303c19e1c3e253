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


# -- agents


class DeadlinePassed(TransientError):
    """The request's deadline came before the step could be done."""


class AllowanceSpent(TransientError):
    """No attempt ticket of the request is left: its allowance is spent (by this handling, or
    by earlier handlings of the same request)."""


# -- schedulers


class Superseded(Exception):
    """A fenced write matched nothing: another attempt owns the order now."""


# -- the operator's commands


class BadInput(OrderflowError):
    """The operator gave something that cannot be an answerable question."""


class NotFound(OrderflowError):
    """What the operator asked about does not exist (an order, its history, a dead letter, an
    alert): the API answers 404, a command exits 1."""


class BenchFailed(OrderflowError):
    """A benchmark run could not be measured: its topology exited or never reported ready, or
    the run went wrong (the message says how, with the topology's last words)."""


# -- the remote service, as its clients see it


class RemoteTransient(TransientError):
    """The remote service did not make the effect this time: 5xx, timeout, no connection."""


class RemoteRefused(RemoteTransient):
    """The remote service refused the caller (401: the account's key) or its fencing token
    (403: a signature that does not check): a configuration to mend, or a request signed by no
    scheduler (one from before an upgrade). No effect was made; a later attempt, from a
    scheduler and an agent configured with the right keys, passes."""


class RemoteDeclined(PermanentError):
    """A business failure the remote service will repeat (e.g. a declined card)."""


class RemoteFenced(PermanentError):
    """The remote service refused a superseded attempt's fencing token."""


class RemoteUndone(PermanentError):
    """The remote service refused the call's effect: an undo of it is recorded for the order."""


class RemoteRejected(PermanentError):
    """The remote service refused the request itself (4xx): a contract bug, not bad luck."""


# -- the remote service's ledger


class StaleFencingToken(Exception):
    """The request's attempt was superseded by a newer one for the same order."""


class Undone(Exception):
    """An undo of the operation is recorded for the order: the effect may no longer be made."""


# -- private servers (the nemesis and the fault suite)


class ServerError(Exception):
    """A private server could not be set up, started, stopped or asked something."""


class ServerMissing(ServerError):
    """What a private server needs is not on this machine: a binary, or the user to run it as."""


class ServerFailed(ServerError):
    """A private server did not start, answer or stop in time; the message ends with its log."""


class TargetUnavailable(TransientError):
    """A notification target did not take a delivery for now (refused connection, timeout, 408,
    429, 5xx): try again after `retry_after_s` when it said (its `Retry-After`), else backoff."""

    def __init__(self, message: str, *, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class TargetRefused(PermanentError):
    """A notification target refused a delivery for good (a 4xx other than 408 and 429, or a
    redirect): dead-letter it with this reason, never retry."""

    reason: str = "refused"
