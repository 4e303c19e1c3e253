"""The seal a consumer puts on its dead letters, so that a replay is accepted as what it was.

A dead letter is replayed by the operator (the `orderflow dlq` commands, or the API's endpoints
as the API's own user), so it comes back under a replayer's broker user, not its original
sender's (`REPLAYERS`, shared/broker/senders.py). The seal says who that sender was: an
HMAC-SHA256, under a key only the processes of the receiving kind hold, over the queue, the
sender and every part of the message a replay sends again (message id, type, correlation id,
reply-to, body). A replay whose seal checks is handled as a message of its original sender;
anything else a replayer's user publishes is refused (`unauthorised`): the operator may replay,
not command.

The key is derived from `ORDERFLOW_SEAL_KEY`, or else from the password in the process's broker
URL (each kind of process has its own user and password, so its own key, and the operator knows
none of them), and from the process's broker user. A dead letter sealed before a password change
no longer checks, unless the key is set explicitly. The key must never be given to the operator
or an application: with it, they could seal what they like (compose does not pass it on). And a
seal is taken only from a replayer's user (a replay) or the consumer's own, never from one
that could only have copied it (consumer.py).
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

from shared.broker.urls import first_url, login_user
from shared.config import BrokerSettings

DERIVATION = b"orderflow dead-letter seal v1"


def seal_key(broker: BrokerSettings) -> bytes | None:
    """This process's key (None: neither a key nor a password to derive one from). Bound to
    the process's own broker user, so that no two kinds share a key by sharing a secret."""
    user = login_user(broker.rabbitmq_url) or ""
    if broker.seal_key is not None:
        secret = broker.seal_key.get_secret_value()
    else:
        password = urlsplit(first_url(broker.rabbitmq_url)).password
        if not password:
            return None
        secret = unquote(password)
    material = secret.encode() + b"\x00" + user.encode()
    return hmac.new(DERIVATION, material, hashlib.sha256).digest()


@dataclass(frozen=True)
class Sealed:
    """What a seal covers: the queue, the original sender, and what a replay sends again."""

    queue: str
    sender: str
    message_id: str
    message_type: str | None
    correlation_id: str | None
    reply_to: str | None
    body: bytes

    def seal(self, key: bytes) -> str:
        """The seal (hex) under `key`."""
        mac = hmac.new(key, digestmod=hashlib.sha256)
        parts = (
            self.queue,
            self.sender,
            self.message_id,
            self.message_type,
            self.correlation_id,
            self.reply_to,
        )
        for part in parts:
            data = b"\x00" if part is None else b"\x01" + part.encode("utf-8", "surrogatepass")
            mac.update(len(data).to_bytes(4, "big") + data)
        mac.update(hashlib.sha256(self.body).digest())
        return mac.hexdigest()

    def checks(self, key: bytes | None, value: object) -> bool:
        """Whether `value` is this seal under `key` (no key: nothing checks)."""
        if key is None or not isinstance(value, str):
            return False
        return hmac.compare_digest(self.seal(key), value)
