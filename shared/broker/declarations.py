"""Declaring a queue that may exist already with other settings, as it is.

A queue's settings are fixed when it is made. RabbitMQ compares a declaration with the queue of
that name one setting at a time (`durable`, `auto_delete`, then each `x-` argument it knows, in
an order of its own) and refuses the first that differs (PRECONDITION_FAILED), naming it and
the queue's value of it:

    inequivalent arg 'x-expires' for queue 'q' in vhost '/': received '300000' but current is
    '600000'

Declaring again with the queue's value of that setting meets the next difference, or succeeds:
after one round per difference the declaration is the queue's own, learned over AMQP alone
(no management API, which an application's broker may not offer). A caller says which
differences it accepts; one it does not is refused before anything is bound to the queue.
The memory broker words its refusals the same way (shared/broker/memory/server.py).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from shared.broker.port import QueueAdmin, QueueMismatch

ROUNDS = 16
"""Declarations tried at most: one per setting that differs (RabbitMQ checks about 15)."""

_INEQUIVALENT = re.compile(
    r"inequivalent arg '(?P<setting>[^']+)' for queue .*: "
    r"received (?P<received>.+?) but current is (?P<current>.+)$"
)
_VALUE = re.compile(r"(?:the value )?'(?P<value>.*?)'(?: of type '(?P<type>[a-z]+)')?")
_INTEGERS = frozenset(
    {"byte", "short", "signedint", "long", "unsignedbyte", "unsignedshort", "unsignedint"}
)
_TEXTS = frozenset({"longstr", "shortstr"})


@dataclass(frozen=True)
class Difference:
    """One setting of a queue that is not what its declaration asked: `durable`,
    `auto_delete` or an `x-` argument, with the value asked and the queue's (None: none)."""

    setting: str
    wanted: Any
    current: Any

    def __str__(self) -> str:
        return f"{self.setting} is {_shown(self.current)}, not {_shown(self.wanted)}"


class Unreadable(ValueError):
    """A refusal that names no setting and value this module can read."""


def difference(said: str) -> tuple[str, Any]:
    """The setting a refusal names and the queue's value of it (None: the queue has none), from
    the broker's words; `Unreadable` if they are not an inequivalence this module can read
    (another connection's exclusive queue, a value of a type it does not know)."""
    found = _INEQUIVALENT.search(said.strip())
    if found is None:
        raise Unreadable(said)
    return found["setting"], _value(found["current"].strip())


def _value(text: str) -> Any:
    if text == "none":
        return None
    found = _VALUE.fullmatch(text)
    if found is None:
        raise Unreadable(text)
    value, kind = found["value"], found["type"]
    if kind is None:  # `durable`, `auto_delete` and the TTLs are said without a type
        if value in ("true", "false"):
            return value == "true"
        if re.fullmatch(r"-?[0-9]+", value):
            return int(value)
        return value
    if kind == "bool":
        return value == "true"
    if kind in _INTEGERS:
        return int(value)
    if kind in _TEXTS:
        return value
    raise Unreadable(f"a value of type {kind}")


def _shown(value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


async def declare_as_it_is(
    admin: QueueAdmin,
    name: str,
    *,
    arguments: dict[str, Any],
    accept: Callable[[Difference], bool],
    rounds: int = ROUNDS,
) -> tuple[Difference, ...]:
    """Declare `name` durable, not auto-delete, not exclusive, with `arguments`; where a queue
    of that name exists with other settings, declare it with the queue's own value of each
    that `accept` accepts, until the broker takes the declaration. The differences accepted
    (none: the queue is as asked, or was made so). Raises the broker's `QueueMismatch` for
    another connection's exclusive queue, a refusal it cannot read, or a difference `accept`
    refuses (its text names that one); what the port raises otherwise."""
    settings: dict[str, Any] = {"durable": True, "auto_delete": False, **arguments}
    accepted: dict[str, Difference] = {}
    for _ in range(rounds):
        try:
            await admin.declare_queue(
                name,
                arguments={k: v for k, v in settings.items() if k.startswith("x-")},
                durable=bool(settings["durable"]),
                auto_delete=bool(settings["auto_delete"]),
            )
        except QueueMismatch as exc:
            try:
                setting, current = difference(exc.said)
            except Unreadable:
                raise exc from None
            found = Difference(setting, settings.get(setting), current)
            if setting in accepted or not accept(found):  # in accepted: the broker insists
                raise QueueMismatch(f"queue {name}: {found}", said=exc.said) from exc
            accepted[setting] = found
            if current is None:
                settings.pop(setting, None)
            else:
                settings[setting] = current
            continue
        return tuple(accepted.values())
    raise QueueMismatch(f"queue {name}: more than {rounds} settings differ")
