"""RabbitMQ definitions for one task hub: a virtual host, a user per kind of process and per
submitting application, and each user's permissions from `shared.broker.access`.

No password is written anywhere. Each user's `password_hash` is a placeholder naming the
environment variable that holds its password (`@HASH:RABBITMQ_SCHEDULER_PASSWORD@`);
`infra/rabbitmq/render-definitions.sh` replaces each with RabbitMQ's salted SHA-256 hash of that
variable's value when the broker container starts, and `password_hash` below does the same in
Python (tests).

Limits (`BrokerLimits`) bound what a compromised or runaway client can take: the virtual host's
connections and queues, and each user's connections and channels (RabbitMQ 3.10 and 4.x import
both from a definitions file: vhost limits as the runtime parameter `vhost-limits`, user limits
as a user's `limits`). RabbitMQ has no per-user queue limit (4.3 validates `max-connections`
and `max-channels` only: rabbit_auth_backend_internal:user_limit_validation/0), so queues are
bounded by who may declare them: no application may (shared/broker/access.py), submission
declares at most `STATUS_QUEUES_PER_APP` status queues for each, and the virtual host's queue
limit must leave room for those, the hub's own and a reply queue per scheduler connection
(`queues_needed`), so that no application can starve a scheduler of its reply queue.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
from dataclasses import asdict, dataclass
from typing import Any

from shared.broker.access import Grant, Resources, app_grant, grant
from shared.broker.private import STATUS_QUEUES_PER_APP
from shared.broker.senders import role_users
from shared.broker.topology import Names

HASHING = "rabbit_password_hashing_sha256"
PLACEHOLDER = re.compile(r"@HASH:([A-Z][A-Z0-9_]*)@")
DEFAULT_APPS = ("shop", "web")
"""The compose deployment's submitting applications: `shop` (`orderflow submit`, the tools
profile) and `web`, the HTTP API (`orderflow serve api`), which submits its shops' orders."""


@dataclass(frozen=True)
class BrokerLimits:
    """The generator's limits (`orderflow deploy rabbitmq-definitions --vhost-max-connections
    N ...`). The defaults leave room to scale: every orderflow process holds one connection
    (a few channels each: publisher, consumers, reply queue, probe), `orderflow submit` one."""

    vhost_max_connections: int = 512
    """Connections to the virtual host, every user together."""
    vhost_max_queues: int = 1024
    """Queues in the virtual host: the hub's durable ones (under 20), one private reply queue
    per scheduler process and the applications' status queues (`queues_needed` is the least
    the generator takes)."""
    service_max_connections: int = 32
    """Connections of one service user (`<hub>-scheduler` serves every scheduler replica)."""
    service_max_channels: int = 256
    """Channels of one service user, over all its connections."""
    app_max_connections: int = 16
    """Connections of one submitting application's user."""
    app_max_channels: int = 64
    """Channels of one submitting application's user, over all its connections."""

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, not {value!r}")


DEAD_LETTER_DELIVERY_LIMIT = 2**31 - 1
"""The delivery limit the definitions give every dead-letter queue: past any listing's reach.
RabbitMQ 4.x gives a quorum queue without one a limit of 20 and drops a message past it (a DLQ
has no dead-letter exchange), and on 4.0-4.2 every return of a listed letter counts (on 4.3
and later a `basic.nack` does not: shared/broker/dead_letters.py). Not -1, 4.x's "unlimited":
RabbitMQ 3.x refuses a negative delivery limit in a policy, and these definitions load there
too (3.x sets no limit by default)."""


def dead_letter_policy(names: Names, vhost: str) -> dict[str, Any]:
    """The policy lifting the delivery limit of the hub's dead-letter queues (each input
    queue's, and the alert feed's). A queue's arguments cannot change once it is declared, and
    a policy applies to the queues that exist as well: importing the definitions again lifts
    the limit of an existing deployment's DLQs. Only one policy applies to a queue, the highest
    `priority`: one of your own that matches a DLQ must carry `delivery-limit` too."""
    queues = [*(names.dlq(q) for q in names.input_queues()), names.alert_dead_letters]
    return {
        "vhost": vhost,
        "name": f"{names.hub}-dead-letters",
        "pattern": Resources(exact=tuple(queues)).regex(),
        "apply-to": "queues",
        "priority": 10,
        "definition": {"delivery-limit": DEAD_LETTER_DELIVERY_LIMIT},
    }


def queues_needed(names: Names, apps: tuple[str, ...], limits: BrokerLimits) -> int:
    """The least room for queues the virtual host must have: the hub's durable queues, every
    application's status queues as submission declares them (one submission process; each
    further one may declare as many again, until they expire), and a reply queue for each
    connection the scheduler's user may hold (one per scheduler process)."""
    status = len(apps) * STATUS_QUEUES_PER_APP
    return len(names.durable_queues()) + status + limits.service_max_connections


def password_variable(role: str, *, app: bool = False) -> str:
    """The environment variable holding the password of a role's user
    (`RABBITMQ_SCHEDULER_PASSWORD`, `RABBITMQ_APP_SHOP_PASSWORD` for the application shop).

    Both `-` and `_` become `_`, so two applications whose names differ only there (`shop-eu`,
    `shop_eu`) would share one: `definitions` refuses such a pair (see `_distinct`)."""
    key = re.sub(r"[^A-Za-z0-9]", "_", role).upper()
    return f"RABBITMQ_{'APP_' if app else ''}{key}_PASSWORD"


def _distinct(users: list[dict[str, Any]]) -> None:
    """Refuse a document where two users share a name or a password variable: one password
    would then open two users' permissions (the applications `shop-eu` and `shop_eu`), or an
    application would take a service's user (an application named `orderflow-admin`)."""
    by_name: set[str] = set()
    by_variable: dict[str, str] = {}
    for user in users:
        name = str(user["name"])
        variable = PLACEHOLDER.sub(r"\1", str(user["password_hash"]))
        if name in by_name:
            raise ValueError(f"two users would be named {name!r}: rename the application")
        if variable in by_variable:
            raise ValueError(
                f"{by_variable[variable]!r} and {name!r} would share the password variable "
                f"{variable} ('-' and '_' both become '_'): rename one of the applications"
            )
        by_name.add(name)
        by_variable[variable] = name


def password_hash(password: str, salt: bytes | None = None) -> str:
    """RabbitMQ's `rabbit_password_hashing_sha256`: base64(salt ++ sha256(salt ++ password))."""
    salt = os.urandom(4) if salt is None else salt
    return base64.b64encode(salt + hashlib.sha256(salt + password.encode()).digest()).decode()


def user_names(hub: str, user_prefix: str | None = None) -> dict[str, str]:
    """Role -> RabbitMQ user name (`<hub>-scheduler` unless another prefix is given): the
    naming every receiver tells its senders apart by (shared/broker/senders.py)."""
    return role_users(hub, user_prefix)


def definitions(
    hub: str,
    vhost: str,
    *,
    apps: tuple[str, ...] = DEFAULT_APPS,
    user_prefix: str | None = None,
    limits: BrokerLimits | None = None,
) -> dict[str, Any]:
    """The definitions document (`rabbitmqctl import_definitions`, or `load_definitions` at
    boot) with password placeholders. An application's user is named after the application:
    `orderflow submit` takes its user name as the application name."""
    limits = BrokerLimits() if limits is None else limits
    names = Names(hub)
    users: list[dict[str, Any]] = []
    permissions: list[dict[str, str]] = []
    topic_permissions: list[dict[str, str]] = []

    def add(user: str, role: str, the_grant: Grant, *, app: bool, tags: list[str]) -> None:
        users.append(
            {
                "name": user,
                "password_hash": f"@HASH:{password_variable(role, app=app)}@",
                "hashing_algorithm": HASHING,
                "tags": tags,
                "limits": {
                    "max-connections": (
                        limits.app_max_connections if app else limits.service_max_connections
                    ),
                    "max-channels": limits.app_max_channels if app else limits.service_max_channels,
                },
            }
        )
        permissions.append(
            {
                "user": user,
                "vhost": vhost,
                "configure": the_grant.configure.regex(),
                "write": the_grant.write.regex(),
                "read": the_grant.read.regex(),
            }
        )
        topic_permissions.extend(
            {
                "user": user,
                "vhost": vhost,
                "exchange": topic.exchange,
                "write": topic.write.regex(),
                "read": topic.read.regex(),
            }
            for topic in the_grant.topics
        )

    for role, user in user_names(hub, user_prefix).items():
        # The admin may log into the management UI, where it sees only this vhost.
        tags = ["management"] if role == "admin" else []
        add(user, role, grant(names, role), app=False, tags=tags)
    for app in apps:
        add(app, app, app_grant(names, app), app=True, tags=[])
    _distinct(users)
    needed = queues_needed(names, apps, limits)
    if limits.vhost_max_queues < needed:
        raise ValueError(
            f"vhost_max_queues {limits.vhost_max_queues} leaves a scheduler no room: the hub's "
            f"queues, {STATUS_QUEUES_PER_APP} status queues for each of {len(apps)} "
            f"application(s) and a reply queue per scheduler connection "
            f"({limits.service_max_connections}) need {needed}"
        )
    vhost_limits = {
        "vhost": vhost,
        "component": "vhost-limits",
        "name": "limits",
        "value": {
            "max-connections": limits.vhost_max_connections,
            "max-queues": limits.vhost_max_queues,
        },
    }
    return {
        "users": users,
        "vhosts": [{"name": vhost}],
        "permissions": permissions,
        "topic_permissions": topic_permissions,
        "parameters": [vhost_limits],
        "policies": [dead_letter_policy(names, vhost)],
        "queues": [],
        "exchanges": [],
        "bindings": [],
    }


def render(document: dict[str, Any]) -> str:
    return json.dumps(document, indent=2) + "\n"


def fill_passwords(text: str, passwords: dict[str, str]) -> str:
    """Replace each placeholder with the hash of the password in `passwords` (tests; the
    broker container does this in `infra/rabbitmq/render-definitions.sh`)."""

    def one(match: re.Match[str]) -> str:
        return password_hash(passwords[match.group(1)])

    return PLACEHOLDER.sub(one, text)


def password_variables(text: str) -> list[str]:
    """Every environment variable a definitions text needs, in order."""
    return list(dict.fromkeys(PLACEHOLDER.findall(text)))
