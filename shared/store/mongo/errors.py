"""Which MongoDB driver errors mean "try later", and which refuse a document for what it holds."""

from __future__ import annotations

from pymongo.errors import (
    BulkWriteError,
    ConnectionFailure,
    ExecutionTimeout,
    OperationFailure,
    PyMongoError,
    WriteConcernError,
)

REFUSED_CODES = frozenset({2, 9, 14, 52, 55, 56, 57, 10334, 17280})
"""Server errors that refuse a document for what it holds: BadValue, FailedToParse,
TypeMismatch, DollarPrefixedFieldName, InvalidDBRef, EmptyFieldName, DottedFieldName,
BSONObjectTooLarge, KeyTooLong."""


RETRYABLE_CODES = frozenset(
    {6, 7, 24, 50, 64, 89, 91, 112, 134, 189, 262, 9001, 10058, 10107, 11600, 11602, 13435, 13436}
)
"""Server codes that mean "try later": the retryable-writes specification's (HostUnreachable,
HostNotFound, NetworkTimeout, ShutdownInProgress, PrimarySteppedDown, ExceededTimeLimit,
SocketException, NotWritablePrimary and its kin, InterruptedAtShutdown,
InterruptedDueToReplStateChange), and LockTimeout, MaxTimeMSExpired, WriteConcernFailed,
WriteConflict, ReadConcernMajorityNotAvailableYet."""
TRANSIENT_LABELS = ("RetryableWriteError", "TransientTransactionError", "RetryableError")
AUTH_CODES = frozenset({13, 18})
"""Unauthorized, AuthenticationFailed: a user, password or role to fix, not an outage."""
INDEX_CONFLICT_CODES = frozenset({85, 86})
"""IndexOptionsConflict, IndexKeySpecsConflict: an index of this name or keys exists as an
older release (or a hand) made it."""
SYSTEM_DATABASES = frozenset({"admin", "local", "config"})


def is_outage(exc: BaseException) -> bool:
    """Whether a driver error means the server cannot do it now (retry later), rather than
    that it refuses it."""
    if isinstance(exc, ConnectionFailure | ExecutionTimeout | WriteConcernError):
        return True  # NotPrimaryError, NetworkTimeout, ServerSelectionTimeoutError; WTimeoutError
    if isinstance(exc, BulkWriteError):
        details = exc.details or {}
        errors = details.get("writeErrors") or []
        concern = bool(details.get("writeConcernErrors"))
        return (concern or bool(errors)) and all(e.get("code") in RETRYABLE_CODES for e in errors)
    if isinstance(exc, OperationFailure):
        return exc.code in RETRYABLE_CODES or any(map(exc.has_error_label, TRANSIENT_LABELS))
    return isinstance(exc, PyMongoError) and exc.timeout


def refuses(exc: BaseException) -> bool:
    if isinstance(exc, BulkWriteError):  # insert_many: every write error a refusal
        errors = (exc.details or {}).get("writeErrors") or []
        return bool(errors) and all(e.get("code") in REFUSED_CODES for e in errors)
    return isinstance(exc, OperationFailure) and exc.code in REFUSED_CODES
