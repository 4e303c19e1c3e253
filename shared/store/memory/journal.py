"""The journal in memory: history and the compensation log (`Journal`)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from shared.domain.journal import CompensationEntry, HistoryEvent, UndoStatus
from shared.store.memory.tables import MemoryPart
from shared.store.values import UndoMark


class MemoryJournal(MemoryPart):
    def _append_history(self, events: Iterable[HistoryEvent]) -> None:
        for event in events:
            self._history[next(self._numbers)] = event.model_copy(update={"seq": None})

    async def append_history(self, event: HistoryEvent) -> None:
        self._append_history([event])

    async def append_history_many(self, events: Sequence[HistoryEvent]) -> None:
        self._append_history(events)

    async def read_history(self, order_id: str) -> list[HistoryEvent]:
        mine = sorted((e.at, n) for n, e in self._history.items() if e.order_id == order_id)
        return [
            self._history[n].model_copy(update={"seq": seq})
            for seq, (_, n) in enumerate(mine, start=1)
        ]

    def _append_compensation(self, entry: CompensationEntry) -> bool:
        key = (entry.order_id, entry.step)
        if key in self._compensation:
            return False
        self._compensation[key] = entry.model_copy(update={"seq": next(self._numbers)})
        return True

    def _mark_compensation(self, order_id: str, undo: UndoMark) -> None:
        entry = self._compensation.get((order_id, undo.step))
        if entry is None or entry.status is UndoStatus.DONE:
            return
        done_at = undo.at if undo.status is UndoStatus.DONE else None
        self._compensation[(order_id, undo.step)] = entry.model_copy(
            update={"status": undo.status, "done_at": done_at, "error": undo.error}
        )

    async def append_compensation(self, entry: CompensationEntry) -> bool:
        """Not on the port: a process records an undo with its state change (`update_state`);
        the contract suite sets up log entries with this."""
        return self._append_compensation(entry)

    async def read_compensation(self, order_id: str) -> list[CompensationEntry]:
        mine = [e for (o, _), e in self._compensation.items() if o == order_id]
        return sorted(mine, key=lambda e: e.seq or 0)
