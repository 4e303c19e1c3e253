"""A fencing token's signature: what makes a token unguessable by anyone but its attempt.

A fencing token is the attempt's instance id, `<order_id>:<attempt>.<nonce>`
(shared/domain/identity.py, the state record's `locked_by`), and anyone can write one: a caller
sending attempt 999999 for an order would move the order's fence past every real attempt, and
the remote service would refuse the real one as superseded; one sending a made-up nonce at the
current attempt would take that attempt number from the real token. So the scheduler that
claimed the attempt signs each token it sends: an HMAC-SHA256 under the **fence key** it shares
with the remote service (one per account: `ORDERFLOW_REMOTE_FENCE_KEY` on the schedulers, the
account's entry in `ORDERFLOW_REMOTE_ACCOUNTS` on the remote), over the account and the token.
The step request carries the signature, the agent passes it on, and the remote refuses a call
whose signature does not check before it counts or applies anything (harness/remote/app.py).
The agents never hold the fence key: a caller with the account's key can still only use tokens
a scheduler signed, so only the attempt that holds a token can advance an order's fence to it.

One HMAC of a short string per step request, and one per call at the remote: microseconds.
"""

from __future__ import annotations

import hmac

DOMAIN = b"orderflow fencing token v1\x00"
"""Keeps these signatures apart from any other HMAC someone might make with the same key."""


def _text(value: str) -> bytes:
    # A token read from JSON may hold a lone surrogate: signed as it came, never an error.
    return value.encode("utf-8", "surrogatepass")


def fence_signature(key: bytes, account: str, fencing_token: str) -> str:
    """The signature (hex) of `fencing_token` in `account` under the fence key `key`. An
    account name has no NUL, so the two parts cannot be shifted into each other."""
    message = DOMAIN + _text(account) + b"\x00" + _text(fencing_token)
    return hmac.digest(key, message, "sha256").hex()


def signature_checks(key: bytes, account: str, fencing_token: str, signature: object) -> bool:
    """Whether `signature` is the token's under `key` (compared in constant time)."""
    if not isinstance(signature, str):
        return False
    expected = fence_signature(key, account, fencing_token)
    return hmac.compare_digest(expected.encode(), _text(signature))
