"""RabbitMQ definitions for one task hub: a virtual host, a user per kind of process and per
submitting application, and each user's permissions from `shared.broker.access`.

No password is written anywhere. Each user's `password_hash` is a placeholder naming the
environment variable that holds its password (`@HASH:RABBITMQ_SCHEDULER_PASSWORD@`);
`infra/rabbitmq/render-definitions.sh` replaces each with RabbitMQ's salted SHA-256 hash of that
variable's value when the broker container starts, and `password_hash` below does the same in
Python (tests).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
from typing import Any

from shared.broker.access import SERVICE_ROLES, Grant, app_grant, grant
from shared.broker.topology import Names

HASHING = "rabbit_password_hashing_sha256"
PLACEHOLDER = re.compile(r"@HASH:([A-Z][A-Z0-9_]*)@")
DEFAULT_APPS = ("shop",)
"""The compose deployment's one submitting application: the shop's web front end."""


def password_variable(role: str, *, app: bool = False) -> str:
    """The environment variable holding the password of a role's user
    (`RABBITMQ_SCHEDULER_PASSWORD`, `RABBITMQ_APP_SHOP_PASSWORD` for the application shop)."""
    key = re.sub(r"[^A-Za-z0-9]", "_", role).upper()
    return f"RABBITMQ_{'APP_' if app else ''}{key}_PASSWORD"


def password_hash(password: str, salt: bytes | None = None) -> str:
    """RabbitMQ's `rabbit_password_hashing_sha256`: base64(salt ++ sha256(salt ++ password))."""
    salt = os.urandom(4) if salt is None else salt
    return base64.b64encode(salt + hashlib.sha256(salt + password.encode()).digest()).decode()


def user_names(hub: str, user_prefix: str | None = None) -> dict[str, str]:
    """Role -> RabbitMQ user name (`<hub>-scheduler` unless another prefix is given)."""
    prefix = f"{hub}-" if user_prefix is None else user_prefix
    return {role: f"{prefix}{role}" for role in SERVICE_ROLES}


def definitions(
    hub: str,
    vhost: str,
    *,
    apps: tuple[str, ...] = DEFAULT_APPS,
    user_prefix: str | None = None,
) -> dict[str, Any]:
    """The definitions document (`rabbitmqctl import_definitions`, or `load_definitions` at
    boot) with password placeholders. An application's user is named after the application:
    `orderflow submit` takes its user name as the application name."""
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
    return {
        "users": users,
        "vhosts": [{"name": vhost}],
        "permissions": permissions,
        "topic_permissions": topic_permissions,
        "parameters": [],
        "policies": [],
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
