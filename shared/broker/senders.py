"""Who sent a message, and whether that sender may send it here.

RabbitMQ checks a message's `user_id` against the user of the connection that published it
(a user without the `impersonator` tag cannot set another's), so a `user_id` is the one part of
a message its sender cannot forge. Every orderflow publisher sets it (shared/broker/publisher.py),
and every receiver checks it against the roles allowed to send to it:

| receiver                         | accepts messages from                                     |
|----------------------------------|-----------------------------------------------------------|
| `<hub>.orders` (submission)      | submitting applications (any user that is no service's)   |
| `<hub>.agent.X` (agent X)        | schedulers                                                |
| a scheduler's reply queue        | the agent of the step each reply answers                  |
| an application's status queue    | submission, schedulers, supervisors, operators, the API   |

A message set aside comes back from its retry queue under the receiver's own user, with the
original sender in a header (`Envelope.sender`); a replay from a dead-letter queue comes under
the operator's user, with the sender and a seal that only the receiver could have made
(shared/broker/seal.py). Anything else, a message without `user_id` included, is refused
(`unauthorised`).

Each kind of process has its user, named `<prefix><role>` (`orderflow-scheduler`): the naming
of the generated definitions (deployment/rabbitmq.py). A process whose own user does not
follow it (one user for every process, as `guest` in development, or a shared account) cannot
tell its peers apart by user; it then accepts messages only from that same user, which nobody
else can claim either.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from shared.broker.topology import Names
from shared.domain.workflow import AGENTS

APP = "application"
"""The role of every submitting application (each one its own user, not a service's)."""

SERVICE_ROLES = (
    "admin",
    "submission",
    "scheduler",
    "supervisor",
    *(f"agent-{name}" for name in AGENTS),
    "operator",
    "notifier",
    "api",
)
"""Every role but the submitting applications, which are named one by one."""

STATUS_SENDERS = frozenset({"submission", "scheduler", "supervisor", "operator", "api"})
"""The processes that report an order's status to its application (the operator and the HTTP
API: an order one of them cancels for its customer, `orderflow orders cancel`)."""
REPLAYERS = frozenset({"operator", "api"})
"""Who replays dead letters, each as its own broker user: the operator (`orderflow dlq replay`)
and the HTTP API (the console's dead letters). A consumer takes a sealed dead letter back from
them (or from its own user), and from nobody else."""


def role_users(hub: str, prefix: str | None = None) -> dict[str, str]:
    """Role -> RabbitMQ user name (`<hub>-scheduler` unless another prefix is given)."""
    start = f"{hub}-" if prefix is None else prefix
    return {role: f"{start}{role}" for role in SERVICE_ROLES}


def agent_role(agent: str) -> str:
    return f"agent-{agent}"


@dataclass(frozen=True)
class Senders:
    """The senders one process tells apart: its own user, and who has which role."""

    users: Mapping[str, str]
    """Role -> user, for the service roles."""
    own_user: str | None
    """The user this process publishes as (None: unknown, so nothing can be checked)."""
    own_role: str
    """This process's role (`APP` for a submitting application)."""

    @classmethod
    def of(cls, hub: str, prefix: str | None, own_user: str | None, own_role: str) -> Senders:
        return cls(role_users(hub, prefix), own_user, own_role)

    @property
    def strict(self) -> bool:
        """Whether senders are told apart by user: this process runs as its role's own user
        (an application: as a user that is no service's)."""
        if self.own_user is None:
            return False
        if self.own_role == APP:
            return self.own_user not in self.users.values()
        return self.users.get(self.own_role) == self.own_user

    def role_of(self, user: str | None) -> str | None:
        """The role of a sender's user: a service role, `APP`, or None (no user)."""
        if user is None:
            return None
        for role, name in self.users.items():
            if name == user:
                return role
        return APP

    def refusal(self, user: str | None, roles: Iterable[str]) -> str | None:
        """Why `user` may not send here, when only `roles` may; None when it may."""
        allowed = frozenset(roles)
        if user is None:
            return "the message has no user_id (every orderflow publisher sets it)"
        if self.own_role == APP and user == self.own_user:
            # An application trusts its own user: what it could send itself forges nothing
            # (and under one user for all, as `guest` in development, that is who reports).
            return None
        if not self.strict:
            if user == self.own_user:
                return None
            return (
                f"sent by user {user!r}: this process runs as {self.own_user!r}, which is no "
                f"role's own user, so it accepts messages from {self.own_user!r} only"
            )
        role = self.role_of(user)
        if role in allowed:
            return None
        may = ", ".join(sorted(allowed))
        return f"sent by user {user!r} ({role}): only {may} may send this here"


def queue_senders(names: Names, queue: str) -> frozenset[str]:
    """The roles that may send to an input queue of the hub."""
    if queue == names.orders:
        return frozenset({APP})
    for agent in AGENTS:
        if queue == names.agent(agent):
            return frozenset({"scheduler"})
    return frozenset()


def queue_role(names: Names, queue: str) -> str:
    """The role of the process that consumes an input queue."""
    if queue == names.orders:
        return "submission"
    for agent in AGENTS:
        if queue == names.agent(agent):
            return agent_role(agent)
    raise ValueError(f"{queue} is not an input queue of hub {names.hub}")
