"""Workflows as data: ordered steps, each naming its agent, its operation and its undo."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from shared.domain.models import (
    RECORD_SCHEMA_VERSION,
    OrderRecord,
    RetryBudget,
    StateRecord,
    StepState,
)
from shared.domain.states import ErrorKind, ProcessState
from shared.domain.transitions import Action, check_transition


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

ORDER_WORKFLOW_V2 = Workflow(
    name="order",
    version=2,
    steps=(
        StepDefinition("reserve", "inventory", "inventory.reserve", "inventory.release"),
        StepDefinition("authorize", "payment", "payment.authorize", "payment.void"),
        StepDefinition("ship", "shipping", "shipping.create", "shipping.cancel"),
        StepDefinition("capture", "payment", "payment.capture", "payment.refund"),
    ),
)
"""Version 2 authorizes the payment before shipping and captures it once the shipment exists,
so a failed shipment voids an authorization instead of refunding a charge."""

AGENTS = ("inventory", "payment", "shipping")

WORKFLOWS: tuple[Workflow, ...] = (ORDER_WORKFLOW, ORDER_WORKFLOW_V2)
"""Every version this build runs. A version stays here until no active order uses it
(`orderflow workflows` shows the active orders per version): a scheduler runs each order on the
version it started with, and parks an order whose version it does not know in Error."""

CURRENT_VERSIONS: dict[str, int] = {"order": 1}
"""The version new orders start on unless `ORDERFLOW_WORKFLOW_VERSION` names another."""

_REGISTRY: dict[tuple[str, int], Workflow] = {(w.name, w.version): w for w in WORKFLOWS}


def get_workflow(name: str, version: int) -> Workflow | None:
    return _REGISTRY.get((name, version))


def registered_versions(name: str) -> list[int]:
    return sorted(version for (wf, version) in _REGISTRY if wf == name)


def current_workflow(name: str = "order", version: int | None = None) -> Workflow:
    """The workflow new orders start on: `version` when given, else this build's current one."""
    chosen = CURRENT_VERSIONS[name] if version is None else version
    workflow = get_workflow(name, chosen)
    if workflow is None:
        known = ", ".join(str(v) for v in registered_versions(name))
        raise ValueError(f"workflow {name} has no version {chosen} (registered: {known})")
    return workflow


def unknown_version(record: StateRecord) -> str | None:
    """Why this build cannot run the record (a workflow version or record layout it does not
    know), or None when it can."""
    if record.schema_version > RECORD_SCHEMA_VERSION:
        return (
            f"state record schema v{record.schema_version} is newer than this build's "
            f"v{RECORD_SCHEMA_VERSION}"
        )
    if get_workflow(record.workflow, record.workflow_version) is None:
        known = ", ".join(f"v{v}" for v in registered_versions(record.workflow)) or "none"
        return (
            f"unknown workflow version: {record.workflow} v{record.workflow_version} "
            f"(this build runs {known})"
        )
    return None


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
    """The Pending state record the submission process inserts beside the order (the row
    `submit`: the store inserts it only if absent)."""
    check_transition(Action.SUBMIT, None, ProcessState.PENDING)
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
