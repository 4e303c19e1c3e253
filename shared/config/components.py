"""The components' own settings: the workflow, the supervisor, the agents, the scheduler, the
submission process and data retention."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from datetime import timedelta
from types import MappingProxyType

from pydantic import Field, field_validator

from shared.config.base import Section
from shared.domain.states import ErrorKind
from shared.domain.workflow import WORKFLOWS, current_workflow


class WorkflowSettings(Section):
    """The workflow: deadlines, budgets and which failures compensate."""

    step_timeout_s: float = Field(default=10.0, gt=0)
    """A step's `complete_by` is its start plus this."""
    retry_budget: int = Field(default=12, ge=1, le=1000)
    """Remote attempts an order may spend end to end (agent retries and recoveries);
    `orderflow audit` holds each order to it, per grant (an operator's resubmit grants a fresh
    one), against the remote service's count."""
    compensate_on: str | None = Field(default=None, max_length=1000)
    """Error kinds that compensate rather than park in Error, for every workflow
    (`permanent,budget-exhausted`) or per workflow (`order=permanent,recovery-limit;other=`);
    kinds: `permanent`, `budget-exhausted`, `recovery-limit`. A workflow not named keeps its own
    policy (the order workflow compensates `permanent`: a declined payment)."""
    workflow_version: int | None = Field(default=None, ge=1)
    """Version of the order workflow that new orders start on (a staged rollout); unset: this
    build's current version. Orders already started always finish on their own version."""
    undo_attempts: int = Field(default=3, ge=1, le=100)
    """Remote attempts one undo request may spend; an undo still failing after them makes the
    order CompensationFailed (undos do not draw on the order's retry budget; `orderflow audit`
    holds each undo request, one per compensation attempt's fencing token, to this)."""

    @field_validator("compensate_on")
    @classmethod
    def _error_kinds(cls, value: str | None) -> str | None:
        if value is not None:
            compensation_policies(value)
        return value

    @field_validator("workflow_version")
    @classmethod
    def _registered_version(cls, value: int | None) -> int | None:
        if value is not None:
            current_workflow("order", value)  # raises ValueError naming the registered ones
        return value

    @property
    def step_timeout(self) -> timedelta:
        return timedelta(seconds=self.step_timeout_s)


COMPENSABLE = (ErrorKind.PERMANENT, ErrorKind.BUDGET_EXHAUSTED, ErrorKind.RECOVERY_LIMIT)
"""The failures that end an attempt for good, which a workflow may compensate or park."""


@functools.cache
def compensation_policies(value: str) -> Mapping[str | None, frozenset[ErrorKind]]:
    """`kind,kind` (every workflow) or `name=kind,kind;name=...` (per workflow; an empty list
    parks every failure), keyed by workflow name, None for every workflow."""
    known = {kind.value: kind for kind in COMPENSABLE}
    names = {workflow.name for workflow in WORKFLOWS}
    policies: dict[str | None, frozenset[ErrorKind]] = {}
    for part in value.split(";"):
        name, equals, kinds = part.strip().rpartition("=")
        key = name.strip() if equals else None
        if key is not None and key not in names:
            raise ValueError(f"{key!r} is not a workflow: {', '.join(sorted(names))}")
        if key in policies:
            raise ValueError(f"workflow {key or '(every)'} is given twice")
        chosen = [kind.strip() for kind in kinds.split(",") if kind.strip()]
        for kind in chosen:
            if kind not in known:
                raise ValueError(f"{kind!r} cannot compensate: {', '.join(known)}")
        policies[key] = frozenset(known[kind] for kind in chosen)
    return MappingProxyType(policies)


class SupervisorSettings(Section):
    """The supervisor: its scans, its lease, and the recovery backoff."""

    supervisor_interval_s: float = Field(default=2.0, gt=0)
    """Time between two scans for expired steps."""
    supervisor_scan_limit: int = Field(default=500, ge=1, le=100_000)
    """Records one scan page returns."""
    lease_ttl_s: float = Field(default=10.0, gt=0)
    """Leader lease period: a dead leader is replaced within it."""
    failure_threshold: int = Field(default=5, ge=1)
    """Recoveries of one order before the supervisor parks it in Error."""
    backoff_base_s: float = Field(default=0.5, gt=0)
    """First recovery's delay before the order may be claimed again (doubles each time)."""
    backoff_cap_s: float = Field(default=30.0, gt=0)
    """Largest exponential recovery delay."""
    cooldown_after: int = Field(default=3, ge=1)
    """Past this many failures an order rests for the cool-down instead."""
    cooldown_s: float = Field(default=60.0, gt=0)
    """The longer rest after repeated failures."""
    stuck_pending_s: float = Field(default=300.0, gt=0)
    """A Pending record due for longer than this is reported as stuck."""


class AgentSettings(Section):
    """The agents: their calls to the remote service, its circuit breakers and their alerts."""

    agent_attempts_per_request: int = Field(default=3, ge=1, le=100)
    """Remote attempts one step request may spend (never more than the order's budget left),
    however often it is handled."""
    agent_http_timeout_s: float = Field(default=5.0, gt=0)
    """Upper bound on one HTTP call to the remote service (the deadline may cut it shorter)."""
    breaker_fail_max: int = Field(default=10, ge=1)
    """Consecutive transient failures of one remote endpoint that open its circuit breaker
    (high enough that a 20% error rate does not trip it: 0.2^10 is one in ten million)."""
    breaker_reset_s: float = Field(default=5.0, gt=0)
    """How long an open circuit fails fast before it lets one trial call through."""
    circuit_alert_after_s: float = Field(default=30.0, gt=0)
    """An agent raises a `circuit-open` alert when a circuit breaker has stayed open (failing
    trial calls included) longer than this; one alert per opening."""


class SchedulerSettings(Section):
    """The scheduler: how much it runs at once and how it looks for work."""

    scheduler_inflight: int = Field(default=200, ge=1, le=100_000)
    """Orders one scheduler process runs at once."""
    claim_batch: int = Field(default=50, ge=1, le=10_000)
    """Records one claim takes at most."""
    poll_interval_s: float = Field(default=0.2, gt=0)
    """How long an idle starter waits before it looks for claimable records again."""


class SubmissionSettings(Section):
    """The submission process: admission control."""

    backlog_threshold: int = Field(default=5000, ge=1)
    """Submission stops taking orders while Pending + Processing exceeds this."""
    backlog_check_s: float = Field(default=1.0, gt=0)
    """How often submission counts the outstanding backlog."""


class RetentionSettings(Section):
    """Data retention: what the supervisor leader purges, and when."""

    retention_s: float = Field(default=30 * 24 * 3600.0, gt=0)
    """History and compensation records of a finished order (Processed, Compensated or
    Cancelled) are deleted this long after it finished (the order and its state record stay
    until `ORDERFLOW_ORDER_RETENTION_S`)."""
    order_retention_s: float = Field(default=90 * 24 * 3600.0, gt=0)
    """A finished order (Processed, Compensated or Cancelled) is deleted, its order record,
    state record and journal together, this long after it finished; parked (Error,
    CompensationFailed) and live orders never are. A submission of its id after that is a new
    order."""
    alert_retention_s: float = Field(default=90 * 24 * 3600.0, gt=0)
    """Stored alerts are deleted this long after they were raised."""
    retention_interval_s: float = Field(default=600.0, gt=0)
    """How often the supervisor leader purges what expired: inbox entries past the dedupe
    window, journals, finished orders and alerts past their retention (while a purge finds
    full batches, it goes on every supervisor round instead)."""
    retention_batch: int = Field(default=1000, ge=1, le=100_000)
    """Records one purge statement deletes at most (a few such batches per supervisor round),
    so that no delete holds up recovery or the store for long."""
