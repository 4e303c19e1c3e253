"""The checks of `orderflow audit`: the invariants of DESIGN §8 against the store and the remote
ledger, and the retry budget against the remote service's count of attempts (`audit.py`
gathers them from a hub).

Violations are numbered by DESIGN §8 (1-5); `6` is the retry budget (DESIGN §6, §9): an order
whose remote calls exceed what it was granted. Forward calls (every operation of the order that
is not one of its workflow's undos) draw on the order's budget, `retry_budget.limit` per grant:
the submission, and each operator resubmit, which grants a fresh budget
(decision:operator-resubmit-grants-fresh-retry-budget).
Undos do not draw on it (decision:undos-spend-no-retry-budget): each undo *request* may spend
`undo_attempts`, and an undo
request is one compensation attempt's call of one undo, named by its fencing token (a
compensation attempt asks each undo once; a crash or a released compensation is a new attempt,
with a new token). An order whose journal has expired (retention) cannot say how often it was
resubmitted, so its forward calls are not checked; its undo requests still are.
"""

from __future__ import annotations

import asyncio
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from services.operator.views import all_states
from shared.domain.identity import attempt_of
from shared.domain.journal import AlertKind, HistoryEvent, HistoryEventType
from shared.domain.models import OrderRecord, StateRecord
from shared.domain.states import LIVE_STATES, SETTLED_STATES, ProcessState
from shared.domain.workflow import get_workflow
from shared.store.port import AlertCursor, StateStore

PAGE = 5000
BUDGET = 6
"""The retry budget's number among the violations (after DESIGN §8's five)."""


@dataclass
class AuditReport:
    orders: int = 0
    effects: int = 0
    attempts: int = 0
    dead_letters: int = 0
    by_state: dict[str, int] = field(default_factory=dict)
    violations: list[dict[str, Any]] = field(default_factory=list)

    def violate(self, invariant: int, order_id: str | None, message: str) -> None:
        self.violations.append({"invariant": invariant, "order_id": order_id, "message": message})

    def to_json(self) -> dict[str, Any]:
        return {
            "orders": self.orders,
            "effects": self.effects,
            "attempts": self.attempts,
            "dead_letters": self.dead_letters,
            "by_state": self.by_state,
            "violations": self.violations,
            "ok": not self.violations,
        }


async def _all_order_ids(store: StateStore) -> list[str]:
    ids: list[str] = []
    after: str | None = None
    while batch := await store.list_order_ids(after=after, limit=PAGE):
        ids += batch
        after = batch[-1]
    return ids


async def audit(
    store: StateStore,
    effects: list[dict[str, Any]],
    *,
    now: datetime,
    grace: timedelta,
    attempts: list[dict[str, Any]] | None = None,
    undo_attempts: int | None = None,
) -> AuditReport:
    """`attempts`: the remote service's count of calls (`GET /attempts`), None when not read
    (the retry budget is then not checked); `undo_attempts`: what one undo request may spend
    (`ORDERFLOW_UNDO_ATTEMPTS`), None to leave undo requests unchecked."""
    report = AuditReport(effects=len(effects), attempts=len(attempts or []))
    states = {s.order_id: s for s in await all_states(store, PAGE)}
    order_ids = await _all_order_ids(store)
    report.orders = len(order_ids)
    counts: dict[str, int] = defaultdict(int)
    for s in states.values():
        counts[s.process_state.value] += 1
    report.by_state = dict(sorted(counts.items()))
    _check_no_order_lost(report, order_ids, states, now=now, grace=grace)
    _check_effects(report, states, effects)
    check_fenced_effects(report, effects)
    _check_settled_unlocked(report, states)
    budgets = None if attempts is None else Budgets(_by_order(attempts), undo_attempts)
    await _check_journal(report, store, states, budgets)
    await _check_conflicts_kept_the_first(report, store)
    return report


def _check_no_order_lost(
    report: AuditReport,
    order_ids: list[str],
    states: dict[str, StateRecord],
    *,
    now: datetime,
    grace: timedelta,
) -> None:
    for order_id in order_ids:
        state = states.get(order_id)
        if state is None:
            report.violate(1, order_id, "order recorded without a state record")
            continue
        if state.process_state in LIVE_STATES:
            if state.complete_by is None:
                report.violate(
                    1,
                    order_id,
                    f"{state.process_state} with no deadline: no supervisor can find it",
                )
            elif state.complete_by < now - grace:
                late = (now - state.complete_by).total_seconds()
                report.violate(
                    1,
                    order_id,
                    f"{state.process_state} with a deadline {late:.0f}s "
                    "past: is a supervisor running?",
                )
    for order_id in set(states) - set(order_ids):
        report.violate(1, order_id, "state record without its order record")


Applied = dict[tuple[str, str], list[dict[str, Any]]]


def _check_effects(
    report: AuditReport, states: dict[str, StateRecord], effects: list[dict[str, Any]]
) -> None:
    applied: Applied = defaultdict(list)
    for effect in effects:
        if effect["order_id"] not in states:
            report.violate(
                2,
                effect["order_id"],
                f"ledger effect {effect['idempotency_key']} for an order the store does not know",
            )
        if effect["outcome"] == "applied":
            applied[(effect["order_id"], effect["operation"])].append(effect)
    for (order_id, operation), made in applied.items():
        if len(made) > 1:
            keys = ", ".join(e["idempotency_key"] for e in made)
            report.violate(2, order_id, f"{len(made)} effects of {operation}: {keys}")
    by_order = _by_order(effects)
    for order_id, state in states.items():
        for message in _missing_effects(state, applied):
            report.violate(2, order_id, message)
        for message in _effects_after_undo(state, by_order.get(order_id, [])):
            report.violate(2, order_id, message)


def _by_order(rows: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    grouped: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        grouped[row["order_id"]].append(row)
    return grouped


def _effects_after_undo(state: StateRecord, effects: list[dict[str, Any]]) -> list[str]:
    """An effect made after its step's undo was recorded (the undo found nothing, or undid an
    earlier one): an effect that no undo will ever cover."""
    workflow = get_workflow(state.workflow, state.workflow_version)
    if workflow is None:
        return []
    messages = []
    for step in workflow.steps:
        undo = next((e for e in effects if e["operation"] == step.undo), None)
        if undo is None:
            continue
        messages += [
            f"{step.operation} applied (seq {e['seq']}) after its undo {step.undo} was recorded "
            f"({undo['outcome']}, seq {undo['seq']}): an effect with no undo"
            for e in effects
            if e["operation"] == step.operation
            and e["outcome"] == "applied"
            and int(e["seq"]) > int(undo["seq"])
        ]
    return messages


def _missing_effects(state: StateRecord, applied: Applied) -> list[str]:
    """A Processed order made every step's effect; a Compensated one undid each it made; a
    Cancelled one (cancelled before any step was sent) made none."""
    workflow = get_workflow(state.workflow, state.workflow_version)
    order_id = state.order_id
    if workflow is None:
        return []
    if state.process_state is ProcessState.PROCESSED:
        return [
            f"Processed without an effect of {step.operation}"
            for step in workflow.steps
            if not applied.get((order_id, step.operation))
        ]
    if state.process_state is ProcessState.COMPENSATED:
        return [
            f"Compensated but {step.operation} was never undone ({step.undo})"
            for step in workflow.steps
            if applied.get((order_id, step.operation)) and not applied.get((order_id, step.undo))
        ]
    if state.process_state is ProcessState.CANCELLED:
        return [
            f"Cancelled but {step.operation} made an effect"
            for step in workflow.steps
            if applied.get((order_id, step.operation))
        ]
    return []


def check_dead_letters(report: AuditReport, letters: list[dict[str, Any]]) -> None:
    """Invariant 5: every refused message sits in its dead-letter queue with a reason."""
    report.dead_letters = len(letters)
    for letter in letters:
        if not letter.get("reason"):
            report.violate(
                5,
                None,
                f"dead letter {letter.get('message_id')} in {letter.get('queue')} has no reason",
            )


def check_fenced_effects(report: AuditReport, effects: list[dict[str, Any]]) -> None:
    """Invariant 3 at the remote service: once an attempt of an order made an effect, no older
    attempt made one after it, nor another token of the same attempt number (a claim that a
    rollback took back and a later claim that numbered its attempt the same are two attempts;
    shared/domain/identity.py). The ledger lists effects in the order they were made."""
    newest: dict[str, tuple[int, str]] = {}
    for effect in sorted(effects, key=lambda e: int(e["seq"])):
        token = effect["fencing_token"]
        attempt = attempt_of(token)
        seen = newest.get(effect["order_id"])
        if seen is not None and attempt < seen[0]:
            report.violate(
                3,
                effect["order_id"],
                f"{effect['operation']} by superseded {token} after an effect by {seen[1]}",
            )
        elif seen is not None and attempt == seen[0] and token != seen[1]:
            report.violate(
                3,
                effect["order_id"],
                f"{effect['operation']} by {token} after an effect by {seen[1]}: two tokens "
                f"of attempt {attempt}",
            )
        else:
            newest[effect["order_id"]] = (attempt, token)


def _check_settled_unlocked(report: AuditReport, states: dict[str, StateRecord]) -> None:
    for state in states.values():
        if state.process_state in SETTLED_STATES and state.locked_by is not None:
            report.violate(
                3, state.order_id, f"{state.process_state} but still locked by {state.locked_by}"
            )


@dataclass(frozen=True)
class Budgets:
    """What the retry budget check needs beside each order's history."""

    attempts: dict[str, list[dict[str, Any]]]
    """The remote service's attempts, by order."""
    undo_attempts: int | None


async def _check_journal(
    report: AuditReport,
    store: StateStore,
    states: dict[str, StateRecord],
    budgets: Budgets | None,
    *,
    concurrency: int = 16,
) -> None:
    """Per order, from its history: invariant 3 (a step's result recorded by one attempt),
    invariant 4 (the order's data are still those it was first submitted with) and the retry
    budget (how many grants the order had)."""
    gate = asyncio.Semaphore(concurrency)
    order_ids = list(states)

    async def check(order_id: str, order: OrderRecord | None) -> None:
        async with gate:
            events = await store.read_history(order_id)
        _check_fenced_history(report, order_id, events)
        if order is not None:
            _check_first_order_kept(report, order, events)
        if budgets is not None:
            calls = budgets.attempts.get(order_id, [])
            check_retry_budget(report, states[order_id], events, calls, budgets.undo_attempts)

    for start in range(0, len(order_ids), PAGE):
        page = order_ids[start : start + PAGE]
        orders = await store.get_orders(page)  # one read per page, not one per order
        await asyncio.gather(*(check(i, order) for i, order in zip(page, orders, strict=True)))


def _check_first_order_kept(
    report: AuditReport, order: OrderRecord, events: list[HistoryEvent]
) -> None:
    """Invariant 4: nothing overwrote the first submission's data. The record's data still
    match the fingerprint stored with them, and the one its OrderSubmitted event recorded
    (events older than that field carry none). An expired journal has nothing to compare."""
    if order.data.fingerprint() != order.fingerprint:
        report.violate(4, order.order_id, "order data no longer match their fingerprint")
    submitted = [
        e.data["fingerprint"]
        for e in events
        if e.type is HistoryEventType.ORDER_SUBMITTED and "fingerprint" in e.data
    ]
    if submitted and submitted[0] != order.fingerprint:
        report.violate(
            4,
            order.order_id,
            f"order data changed since first submitted ({submitted[0][:12]}… -> "
            f"{order.fingerprint[:12]}…)",
        )


async def _check_conflicts_kept_the_first(report: AuditReport, store: StateStore) -> None:
    """Invariant 4 from the other side: a submission refused as a conflict (its alert names
    the refused data's fingerprint) did not become the stored order."""
    after: AlertCursor | None = None
    while alerts := await store.list_alerts(limit=PAGE, after=after):
        after = AlertCursor(alerts[-1].at, alerts[-1].alert_id)
        conflicts = [
            (alert.order_id, alert.alert_id.rpartition(":")[2])
            for alert in alerts
            if alert.kind is AlertKind.DUAL_WRITE_CONFLICT and alert.order_id is not None
        ]
        if not conflicts:
            continue
        orders = await store.get_orders([order_id for order_id, _ in conflicts])
        for (order_id, refused), order in zip(conflicts, orders, strict=True):
            if order is not None and refused and order.fingerprint.startswith(refused):
                report.violate(
                    4, order_id, "a submission refused as a conflict replaced the first order"
                )


def _check_fenced_history(report: AuditReport, order_id: str, events: list[HistoryEvent]) -> None:
    """Invariant 3 in the store: a step's result is recorded by one attempt only (history is
    appended after the fenced write succeeded), unless an operator resubmitted the order."""
    resubmits = sum(1 for e in events if e.type is HistoryEventType.RESUBMITTED)
    completed = Counter(e.step for e in events if e.type is HistoryEventType.STEP_COMPLETED)
    for step, times in completed.items():
        if times > 1 + resubmits:
            attempts = sorted(
                {
                    e.attempt or 0
                    for e in events
                    if e.type is HistoryEventType.STEP_COMPLETED and e.step == step
                }
            )
            report.violate(
                3, order_id, f"step {step} completed {times} times, by attempts {attempts}"
            )


def check_retry_budget(
    report: AuditReport,
    state: StateRecord,
    events: list[HistoryEvent],
    attempts: list[dict[str, Any]],
    undo_attempts: int | None,
) -> None:
    """Violation 6: the order's remote calls beyond what it was granted (the module's doc)."""
    workflow = get_workflow(state.workflow, state.workflow_version)
    if workflow is None or not attempts:
        return
    undos = {step.undo for step in workflow.steps}
    forward = Counter(a["operation"] for a in attempts if a["operation"] not in undos)
    # An expired journal cannot say how many grants the order had, nor one whose oldest events
    # a store's bound cut (its first event kept is not the first: MongoDB,
    # decision:mongodb-transition-one-write).
    if events and events[0].seq in (None, 1):
        grants = 1 + sum(1 for e in events if e.type is HistoryEventType.RESUBMITTED)
        granted = state.retry_budget.limit * grants
        spent = forward.total()
        if spent > granted:
            grant = "" if grants == 1 else f" ({grants} grants of {state.retry_budget.limit})"
            calls = ", ".join(f"{op} {n}" for op, n in sorted(forward.items()))
            report.violate(
                BUDGET,
                state.order_id,
                f"{spent} remote attempts ({calls}) beyond its retry budget of {granted}{grant}",
            )
    if undo_attempts is None:
        return
    requests = Counter(
        (a["operation"], a["fencing_token"]) for a in attempts if a["operation"] in undos
    )
    for (operation, token), n in sorted(requests.items()):
        if n > undo_attempts:
            report.violate(
                BUDGET,
                state.order_id,
                f"{n} attempts of {operation} by {token}, beyond the {undo_attempts} one undo "
                "request may spend",
            )
