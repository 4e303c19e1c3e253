"""The attempt's identity: `<order_id>:<attempt>.<nonce>`, the id a claim writes into
`locked_by`, the fencing token of every write and remote call of that attempt.

The nonce is random, made once per claim (`new_nonce`). The attempt number alone cannot tell two
attempts apart: a claim whose write a failover rolls back rolls `attempt` back with it, and the
next claim numbers its attempt the same. With the nonce the two attempts carry different tokens,
so no two attempts ever share a fence, rollback or not; a fence that has seen one token at an
attempt number refuses any other at that number (harness/remote/ledger.py).

The nonce goes after the attempt, behind a `.`, so the token still splits at its last `:` into
the order id (which may hold `:` and `.`) and the attempt. A token written before nonces,
`<order_id>:<attempt>` (an order in flight across the upgrade), still parses and fences by its
attempt as it did.
"""

from __future__ import annotations

import re
import secrets

_TAIL = re.compile(r"([0-9]+)(?:\.([A-Za-z0-9_-]{1,16}))?")
"""What follows the last `:`: the attempt, then the nonce if the token has one."""
_NONCE = re.compile(r"[A-Za-z0-9_-]{1,16}")


def new_nonce() -> str:
    """A claim's nonce: 48 random bits in 8 URL-safe characters. Short, because the token is
    bounded (120 characters in a step request, the longest order id is 105); enough, because
    it only has to differ from the nonce of the one claim a rollback took back."""
    return secrets.token_urlsafe(6)


def instance_id(order_id: str, attempt: int, nonce: str) -> str:
    """The attempt-specific id a claim writes into `locked_by`: it fences every later write."""
    if attempt < 1:
        raise ValueError("attempts are numbered from 1")
    if not _NONCE.fullmatch(nonce):
        raise ValueError(f"not a nonce: {nonce!r}")
    return f"{order_id}:{attempt}.{nonce}"


def parse_instance_id(value: str) -> tuple[str, int]:
    """(order id, attempt) of an instance id, with its nonce or from before nonces; ValueError
    for anything else (the remote service reads the attempt of a fencing token with
    `attempt_of`)."""
    order_id, attempt, _ = _parse(value)
    return order_id, attempt


def nonce_of(value: str) -> str | None:
    """The nonce of an instance id; None for one from before nonces. ValueError for anything
    that is not an instance id."""
    return _parse(value)[2]


def _parse(value: str) -> tuple[str, int, str | None]:
    order_id, sep, tail = value.rpartition(":")
    found = _TAIL.fullmatch(tail)
    if not sep or not order_id or found is None:
        raise ValueError(f"not an instance id: {value!r}")
    return order_id, int(found[1]), found[2]


def attempt_of(fencing_token: str) -> int:
    """The attempt a fencing token names (an instance id); 0 for a token that is not one, which
    any fence refuses. Two tokens of one attempt number are still different attempts: a fence
    compares the whole token when the numbers are equal."""
    try:
        return parse_instance_id(fencing_token)[1]
    except ValueError:
        return 0
