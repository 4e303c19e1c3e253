"""Least privilege on the broker: what each kind of process may do with each queue and exchange.

RabbitMQ grants a user, per virtual host, three regular expressions matched against resource
names (queues and exchanges alike): *configure* (declare, delete), *write* (publish to an
exchange; bind a queue as the destination) and *read* (consume from or purge a queue; bind from
an exchange as the source). Passive declares need none. On a topic exchange, *topic permissions*
further limit the routing keys a user may publish with (write) and bind with (read).

This table is written from what each process does in the code (and checked against it: unit
tests compare it with a table of uses, a system test runs every process under its own user):

| kind          | consumes               | publishes to                    | declares        |
|---------------|------------------------|---------------------------------|-----------------|
| admin (init)  | -                      | -                               | the topology    |
| submission    | orders                 | dlx, orders.retry, alerts, status | -             |
| scheduler     | its reply queue        | direct (requests), alerts, status | its reply queue |
| supervisor    | -                      | alerts, status                  | -               |
| agent X       | agent.X                | dlx, agent.X.retry, alerts, replies | -           |
| operator      | every DLQ (get, purge) | direct (replays)                | -               |
| application A | its status queues      | submit                          | its status queues |

A reply queue is bound to `replies`, a status queue to `status` (by its owner, which needs read on
that exchange and write on its queue to bind).

Nobody may write to the default exchange: it routes to every queue by name.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from shared.broker.topology import Names
from shared.domain.workflow import AGENTS

NOTHING = "^$"
"""Matches no resource name (RabbitMQ's own way to grant nothing)."""

SERVICE_ROLES = (
    "admin",
    "submission",
    "scheduler",
    "supervisor",
    *(f"agent-{name}" for name in AGENTS),
    "operator",
)
"""Every role but the submitting applications, which are named one by one."""


@dataclass(frozen=True)
class Resources:
    """Names a permission covers: exact names, and prefixes (a prefix covers longer names)."""

    exact: tuple[str, ...] = ()
    prefixes: tuple[str, ...] = ()

    def regex(self) -> str:
        """An anchored regex matching exactly these names (RabbitMQ searches unanchored)."""
        parts = [re.escape(n) for n in sorted(set(self.exact))]
        parts += [re.escape(p) + ".+" for p in sorted(set(self.prefixes))]
        return f"^({'|'.join(parts)})$" if parts else NOTHING

    def __or__(self, other: Resources) -> Resources:
        return Resources(self.exact + other.exact, self.prefixes + other.prefixes)


@dataclass(frozen=True)
class TopicGrant:
    """Routing keys a user may publish with (`write`) and bind with (`read`) on `exchange`."""

    exchange: str
    write: Resources = Resources()
    read: Resources = Resources()


@dataclass(frozen=True)
class Grant:
    configure: Resources = Resources()
    write: Resources = Resources()
    read: Resources = Resources()
    topics: tuple[TopicGrant, ...] = field(default=())


def _one(*names: str) -> Resources:
    return Resources(exact=names)


def grant(names: Names, role: str) -> Grant:
    """What the service `role` (one of `SERVICE_ROLES`) may do in the hub `names`."""
    reply = Resources(prefixes=(f"{names.hub}.reply.",))
    status_keys = Resources(prefixes=(f"{names.hub}.status.",))
    if role == "admin":
        everything = _one(*names.exchanges(), *names.durable_queues())
        return Grant(configure=everything, write=everything, read=everything)
    if role == "submission":
        return Grant(
            write=_one(names.dead_letters, names.retry(names.orders), names.alerts, names.status),
            read=_one(names.orders),
            topics=(TopicGrant(names.status, write=status_keys),),
        )
    if role == "scheduler":
        return Grant(
            configure=reply,
            write=_one(names.exchange, names.alerts, names.status) | reply,
            read=_one(names.replies) | reply,
            topics=(
                TopicGrant(names.replies, read=reply),
                TopicGrant(names.status, write=status_keys),
            ),
        )
    if role == "supervisor":
        # status: the Failed message of an order it parks at the failure threshold.
        return Grant(
            write=_one(names.alerts, names.status),
            topics=(TopicGrant(names.status, write=status_keys),),
        )
    if role.startswith("agent-") and role.removeprefix("agent-") in AGENTS:
        queue = names.agent(role.removeprefix("agent-"))
        return Grant(
            write=_one(names.dead_letters, names.retry(queue), names.alerts, names.replies),
            read=_one(queue),
            topics=(TopicGrant(names.replies, write=reply),),
        )
    if role == "operator":
        return Grant(
            write=_one(names.exchange),
            read=_one(*(names.dlq(q) for q in names.input_queues())),
        )
    raise ValueError(f"no role {role!r}: one of {', '.join(SERVICE_ROLES)} (or an application)")


def app_grant(names: Names, app: str) -> Grant:
    """A submitting application: submits orders, and follows them on its own status queues,
    which no other application may declare, bind or read."""
    own = Resources(prefixes=(names.status_prefix(app),))
    return Grant(
        configure=own,
        write=_one(names.submit) | own,
        read=_one(names.status) | own,
        topics=(TopicGrant(names.status, read=own),),
    )
