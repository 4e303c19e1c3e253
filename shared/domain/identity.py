"""The attempt's identity: `<order_id>:<attempt>`, the id a claim writes into `locked_by`, the
fencing token of every write and remote call of that attempt."""

from __future__ import annotations


def instance_id(order_id: str, attempt: int) -> str:
    """The attempt-specific id a claim writes into `locked_by`: it fences every later write."""
    if attempt < 1:
        raise ValueError("attempts are numbered from 1")
    return f"{order_id}:{attempt}"


def parse_instance_id(value: str) -> tuple[str, int]:
    """(order id, attempt) of an instance id; ValueError for anything else (the remote service
    reads the attempt of a fencing token with `attempt_of`)."""
    order_id, sep, attempt = value.rpartition(":")
    if not sep or not order_id or not attempt.isdigit():
        raise ValueError(f"not an instance id: {value!r}")
    return order_id, int(attempt)


def attempt_of(fencing_token: str) -> int:
    """The attempt a fencing token names (an instance id); 0 for a token that is not one, which
    any fence refuses."""
    try:
        return parse_instance_id(fencing_token)[1]
    except ValueError:
        return 0
