"""Broker URLs: one AMQP URL, or a comma-separated list of the nodes of one RabbitMQ cluster.

`amqp://app:pw@rabbit-1:5672/shop,amqp://app:pw@rabbit-2:5672/shop,amqp://app:pw@rabbit-3:5672/shop`

Each URL carries its own credentials and virtual host, but a cluster shares its users and virtual
hosts, so every URL of a list must name the same user, password and virtual host: a list that
does not is a typo, reported as such (and the user is what every message's `user_id` names, so
it cannot change on a failover). A comma inside a password must be percent-encoded (`%2C`).

A process connects to one node, and on losing it to the next (`NodeRotation`): the start is
drawn at random per process, so that a fleet spreads over the nodes, then round-robin.
"""

from __future__ import annotations

import random
from urllib.parse import unquote, urlsplit

from shared.store.urls import redact

SCHEMES = ("amqp", "amqps")
SHAPE = "amqp://user:password@host:5672/vhost"


def broker_urls(value: str) -> tuple[str, ...]:
    """The URLs of a setting, each checked; ValueError with a one-line reason otherwise."""
    items = [item.strip() for item in value.split(",")]
    if any(not item for item in items):
        raise ValueError(
            "RabbitMQ URL list has an empty item: separate whole URLs with single commas "
            f"({SHAPE},amqp://…@host2:5672/vhost)"
        )
    many = len(items) > 1
    seen: dict[tuple[str, int], int] = {}
    for number, url in enumerate(items, 1):
        where = (
            f"item {number} ({redact(url)}) of the RabbitMQ URL list" if many else "RabbitMQ URL"
        )
        parts = urlsplit(url)
        if parts.scheme not in SCHEMES or not parts.hostname:
            hint = " (each item of a list is a whole URL)" if many and "://" not in url else ""
            raise ValueError(f"{where} must look like {SHAPE}{hint}")
        try:
            port = parts.port
        except ValueError:
            port_text = parts.netloc.rpartition("@")[2].rpartition(":")[2]
            raise ValueError(f"{where}: port {port_text!r} is not a port number") from None
        node = (parts.hostname, port or (5671 if parts.scheme == "amqps" else 5672))
        if node in seen:
            raise ValueError(f"{where} names the node of item {seen[node]} again")
        seen[node] = number
    first = urlsplit(items[0])
    for number, url in enumerate(items[1:], 2):
        parts = urlsplit(url)
        for what, mine, theirs in (
            ("user", parts.username, first.username),
            ("password", parts.password, first.password),
            ("virtual host", _vhost(parts.path), _vhost(first.path)),
        ):
            if mine != theirs:
                raise ValueError(
                    f"item {number} ({redact(url)}) of the RabbitMQ URL list names another "
                    f"{what} than item 1: the nodes of one cluster share their users and "
                    "virtual hosts"
                )
    return tuple(items)


def _vhost(path: str) -> str:
    return unquote(path[1:]) if len(path) > 1 else "/"


def first_url(value: str) -> str:
    """The first URL of a list (the user, password and virtual host of every one of them)."""
    return value.split(",", 1)[0].strip()


class NodeRotation:
    """Which node a process tries next: a random first one, then each in turn, round and round."""

    def __init__(self, urls: tuple[str, ...], *, rng: random.Random | None = None) -> None:
        if not urls:
            raise ValueError("no RabbitMQ URL")
        self.urls = urls
        self._index = (rng or random).randrange(len(urls))
        self._started = False

    def next(self) -> str:
        """The URL of the next attempt (the first call: the drawn start)."""
        if self._started:
            self._index = (self._index + 1) % len(self.urls)
        self._started = True
        return self.urls[self._index]

    @property
    def current(self) -> str:
        return self.urls[self._index]


def login_user(url: str) -> str | None:
    """The broker user a URL logs in as: what RabbitMQ checks each message's `user_id` against,
    and what every publisher sets it to (shared/broker/senders.py). With `auth=external` the
    client certificate names the user, and the URL must name the same (`amqps://NAME@host/…`)."""
    parts = urlsplit(first_url(url))  # every URL of a list names the same user (urls.py)
    return unquote(parts.username) if parts.username else None
