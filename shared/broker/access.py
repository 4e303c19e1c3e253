"""Least privilege on the broker: what each kind of process may do with each queue and exchange.

RabbitMQ grants a user, per virtual host, three regular expressions matched against resource
names (queues and exchanges alike): *configure* (declare, delete), *write* (publish to an
exchange; bind a queue as the destination) and *read* (consume from or purge a queue; bind from
an exchange as the source). Passive declares need none. On a topic exchange, *topic permissions*
further limit the routing keys a user may publish with (write) and bind with (read).

This table is written from what each process does in the code (and checked against it: unit
tests compare it with a table of uses, a system test runs every process under its own user):

| kind          | consumes               | publishes to                          | declares      |
|---------------|------------------------|---------------------------------------|---------------|
| admin (init)  | -                      | -                                     | the topology  |
| submission    | orders                 | orders.dlq, orders.retry, alerts,     | (see below)   |
|               |                        | status                                |               |
| scheduler     | its reply queue        | direct (requests), alerts, status     | reply queue   |
| supervisor    | -                      | alerts, status                        | -             |
| agent X       | agent.X                | agent.X.dlq, agent.X.retry, alerts,   | -             |
|               |                        | replies                               |               |
| operator      | every DLQ (get, purge) | each input queue's replay exchange    | -             |
|               | alerts.feed (follow),  |                                       |               |
|               | alerts.feed.dlq (get)  |                                       |               |
| notifier      | alerts.feed            | alerts.feed.dlq                       | -             |
| api (its      | every DLQ (get, purge) | each input queue's replay exchange,   | -             |
| operator      |                        | status                                |               |
| endpoints)    |                        |                                       |               |
| application A | its status queues      | submit                                | -             |

A scheduler binds its reply queue to `replies`. An application neither declares nor binds its
status queues: submission declares and binds the one an order names (once it is sure the queue
is the application's; at most `STATUS_QUEUES_PER_APP` of one application, shared/broker/private.py),
so an application can fill the virtual host with no queue of its own (one that declared a
thousand starved a restarting scheduler of its reply queue), reads no exchange at all, and
cannot bind one (`status`, say) into another (`submit`) to loop our messages back into the
orders queue. The broker's own dead-lettering (its
delivery limit) goes through `dlx`, to which nobody may publish.

Each `<queue>.dlq` and `<queue>.retry` exchange is written only by that queue's consumer, and
each `<queue>.replay` only by the operator: no user can put a message into another process's
dead-letter queue or, except through a replay its consumer checks (shared/broker/seal.py), into
another process's queue. Who sent a message is then checked by its receiver from its
broker-verified `user_id` (shared/broker/senders.py).

Nobody may write to the default exchange: it routes to every queue by name.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from shared.broker.senders import SERVICE_ROLES
from shared.broker.topology import Names
from shared.domain.workflow import AGENTS

__all__ = ["NOTHING", "SERVICE_ROLES", "Grant", "Resources", "TopicGrant", "app_grant", "grant"]

NOTHING = "^$"
"""Matches no resource name (RabbitMQ's own way to grant nothing)."""


@dataclass(frozen=True)
class Resources:
    """Names a permission covers: exact names, and prefixes (a prefix covers longer names)."""

    exact: tuple[str, ...] = ()
    prefixes: tuple[str, ...] = ()
    shapes: tuple[str, ...] = ()
    """Regexes (unanchored parts) for names of a fixed shape: a binding key that must name one
    queue, never match many (`#`, `*`)."""

    def regex(self) -> str:
        """An anchored regex matching exactly these names (RabbitMQ searches unanchored)."""
        parts = [re.escape(n) for n in sorted(set(self.exact))]
        parts += [re.escape(p) + ".+" for p in sorted(set(self.prefixes))]
        parts += sorted(set(self.shapes))
        return f"^({'|'.join(parts)})$" if parts else NOTHING

    def __or__(self, other: Resources) -> Resources:
        return Resources(
            self.exact + other.exact,
            self.prefixes + other.prefixes,
            self.shapes + other.shapes,
        )


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
    # Binding keys: exactly one reply or status queue's name, no wildcard (a `#` would route
    # every scheduler's replies, or every application's statuses, into one queue).
    one_reply = Resources(
        shapes=(re.escape(f"{names.hub}.reply.") + r"[A-Za-z0-9_-]+\.[0-9a-f]{12}",)
    )
    one_status = Resources(
        shapes=(re.escape(f"{names.hub}.status.") + r"[a-z][a-z0-9_-]{0,39}\.[A-Za-z0-9_-]{1,64}",)
    )
    if role == "admin":
        everything = _one(*names.exchanges(), *names.durable_queues())
        return Grant(configure=everything, write=everything, read=everything)
    if role == "submission":
        orders = names.orders
        # configure and write on status queues: to declare one for its application and bind it
        # (StatusBinder).
        return Grant(
            configure=status_keys,
            write=_one(names.dlq(orders), names.retry(orders), names.alerts, names.status)
            | status_keys,
            read=_one(orders, names.status),
            topics=(TopicGrant(names.status, write=status_keys, read=one_status),),
        )
    if role == "scheduler":
        return Grant(
            configure=reply,
            write=_one(names.exchange, names.alerts, names.status) | reply,
            read=_one(names.replies) | reply,
            topics=(
                TopicGrant(names.replies, read=one_reply),
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
            write=_one(names.dlq(queue), names.retry(queue), names.alerts, names.replies),
            read=_one(queue),
            topics=(TopicGrant(names.replies, write=reply),),
        )
    if role == "operator":
        inputs = names.input_queues()
        # status: the Cancelled message of an order it cancels (`orderflow orders cancel`).
        return Grant(
            write=_one(*(names.replay(q) for q in inputs), names.status),
            # alerts.feed: `orderflow alerts follow`, the alert feed's reader; its dead letters:
            # `orderflow alerts undelivered`.
            read=_one(*(names.dlq(q) for q in inputs), names.alert_feed, names.alert_dead_letters),
            topics=(TopicGrant(names.status, write=status_keys),),
        )
    if role == "notifier":
        # Delivers the alert feed to the webhooks; sets aside what a target refused for good.
        return Grant(write=_one(names.alert_dead_letters), read=_one(names.alert_feed))
    if role == "api":
        inputs = names.input_queues()
        # The HTTP API's operator endpoints: dead letters listed, shown, replayed and purged
        # (read on the DLQs, write on the replay exchanges); the Cancelled status of an order it
        # cancels (`status`). Queue depths are passive declares, which need nothing. Not the
        # alert feed: the notifier's alone to take.
        return Grant(
            write=_one(*(names.replay(q) for q in inputs), names.status),
            read=_one(*(names.dlq(q) for q in inputs)),
            topics=(TopicGrant(names.status, write=status_keys),),
        )
    raise ValueError(f"no role {role!r}: one of {', '.join(SERVICE_ROLES)} (or an application)")


def app_grant(names: Names, app: str) -> Grant:
    """A submitting application: submits orders, and follows them on its own status queues,
    which no other application may read. It declares no queue and reads no exchange:
    submission declares and binds its status queues for it (see the module's docstring)."""
    own = Resources(prefixes=(names.status_prefix(app),))
    return Grant(write=_one(names.submit), read=own)
