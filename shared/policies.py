"""The policies the settings choose, built where a process is put together (the bootstrap,
a scheduler's context, the supervisor): which failures compensate, and how recovery backs off."""

from __future__ import annotations

import random
from datetime import timedelta

from shared.config import SupervisorSettings, WorkflowSettings
from shared.config.components import compensation_policies
from shared.domain.models import StateRecord
from shared.domain.states import ErrorKind
from shared.domain.timing import recovery_backoff
from shared.domain.updates import RecoveryPolicy
from shared.domain.workflow import Workflow, get_workflow


def compensates(settings: WorkflowSettings, workflow: Workflow, kind: ErrorKind) -> bool:
    """Whether a failure of this kind compensates the workflow's completed steps (else the
    order is parked in Error for an operator)."""
    if settings.compensate_on is None:
        return workflow.compensates(kind)
    policies = compensation_policies(settings.compensate_on)  # parsed once per value
    override = policies.get(workflow.name, policies.get(None))
    return workflow.compensates(kind, override)


def recovery_policy(
    supervisor: SupervisorSettings, workflow: WorkflowSettings, rng: random.Random | None = None
) -> RecoveryPolicy:
    """When a recovered order may be claimed again, and what happens at the threshold.
    `rng` draws the jitter; None: the process's `random` (which a simulation seeds)."""

    def compensate_at_limit(record: StateRecord) -> bool:
        chosen = get_workflow(record.workflow, record.workflow_version)
        return chosen is not None and compensates(workflow, chosen, ErrorKind.RECOVERY_LIMIT)

    return RecoveryPolicy(
        failure_threshold=supervisor.failure_threshold,
        backoff=lambda failures: recovery_backoff(
            failures,
            base=timedelta(seconds=supervisor.backoff_base_s),
            cap=timedelta(seconds=supervisor.backoff_cap_s),
            cooldown_after=supervisor.cooldown_after,
            cooldown=timedelta(seconds=supervisor.cooldown_s),
            rng=rng,
        ),
        compensate_at_limit=compensate_at_limit,
    )
