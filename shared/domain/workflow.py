"""Workflows as data: ordered steps, each naming its agent, its operation and its undo."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from shared.domain.models import OrderRecord, RetryBudget, StateRecord, StepState
from shared.domain.states import ErrorKind, ProcessState


@dataclass(frozen=True)
class StepDefinition:
    name: str
    agent: str
    """The agent whose queue receives the request: `<hub>.agent.<agent>`."""
    operation: str
    undo: str


@dataclass(frozen=True)
class Workflow:
    name: str
    version: int
    steps: tuple[StepDefinition, ...]
    compensate_on: frozenset[ErrorKind] = frozenset({ErrorKind.PERMANENT})
    """Failures after which the completed steps are undone; any other failure parks the order
    in Error for an operator. By default a business failure (a declined payment) compensates,
    and a spent budget or a remote outage past the recovery threshold parks."""

    def compensates(self, kind: ErrorKind, override: frozenset[ErrorKind] | None = None) -> bool:
        return kind in (self.compensate_on if override is None else override)

    def step(self, name: str) -> StepDefinition:
        for step in self.steps:
            if step.name == name:
                return step
        raise KeyError(f"workflow {self.name} v{self.version} has no step {name!r}")

    def is_last(self, name: str) -> bool:
        return self.steps[-1].name == name


ORDER_WORKFLOW = Workflow(
    name="order",
    version=1,
    steps=(
        StepDefinition("reserve", "inventory", "inventory.reserve", "inventory.release"),
        StepDefinition("charge", "payment", "payment.charge", "payment.refund"),
        StepDefinition("ship", "shipping", "shipping.create", "shipping.cancel"),
    ),
)

AGENTS = ("inventory", "payment", "shipping")

_REGISTRY: dict[tuple[str, int], Workflow] = {
    (ORDER_WORKFLOW.name, ORDER_WORKFLOW.version): ORDER_WORKFLOW,
}


def get_workflow(name: str, version: int) -> Workflow | None:
    return _REGISTRY.get((name, version))


def idempotency_key(order_id: str, step: str, *, undo: bool = False) -> str:
    """Stable across attempts, so a repeated request never makes a second effect."""
    return f"{order_id}:{step}:undo" if undo else f"{order_id}:{step}"


def new_state_record(
    order: OrderRecord,
    workflow: Workflow,
    *,
    now: datetime,
    retry_budget: int,
    reply_to: str | None,
) -> StateRecord:
    """The Pending state record the submission process inserts beside the order."""
    return StateRecord(
        order_id=order.order_id,
        process_state=ProcessState.PENDING,
        workflow=workflow.name,
        workflow_version=workflow.version,
        steps={step.name: StepState() for step in workflow.steps},
        retry_budget=RetryBudget(limit=retry_budget),
        reply_to=reply_to,
        next_attempt_at=now,
        created_at=now,
        updated_at=now,
    )
