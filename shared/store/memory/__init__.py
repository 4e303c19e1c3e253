"""The reference adapter of the state store: the port's semantics in memory, nothing more.

Built directly on the pure rules of `shared.domain.updates` (`matches`, `apply`): a conditional
update is those two functions over a dictionary, so this adapter is what the contract says, with
no query language or driver between. It passes the same contract suite as PostgreSQL and MongoDB
(`[memory]`), and serves the tests that drive processes without servers. It is not durable and is
shared only within one process (records are frozen models, handed out as they are kept).

Each operation runs without an await in its body, so it is atomic among the event loop's tasks,
as one statement is in the real stores; every method yields to the loop once first (`MemoryPart`
wraps each in `yielding`), so that concurrent callers interleave between operations as they would
over a connection.

One class per part of the port, in modules named as the other adapters' are (`states.py`,
`queries.py`, `journal.py`, `inbox.py`, `coordination.py`, `tokens.py`, `retention.py`), over the
tables of `tables.py`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from shared.store.memory.coordination import MemoryCoordination
from shared.store.memory.inbox import MemoryInbox
from shared.store.memory.queries import MemoryQueries
from shared.store.memory.retention import MemoryRetention
from shared.store.memory.states import MemoryStates
from shared.store.memory.tables import TABLES, MemoryAdmin
from shared.store.memory.tokens import MemoryTokens
from shared.store.port import StateStore

__all__ = ["TABLES", "MemoryStore"]


class MemoryStore(
    MemoryAdmin,
    MemoryStates,
    MemoryQueries,
    MemoryInbox,
    MemoryCoordination,
    MemoryTokens,
    MemoryRetention,
):
    """State store in this process's memory (one hub; `MemoryStore()` per hub)."""


if TYPE_CHECKING:  # the reference adapter implements the whole port (no factory returns it)
    _IS_A_STORE: type[StateStore] = MemoryStore
