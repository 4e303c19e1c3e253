"""Which workflow versions this build runs and which ones orders still use (`orderflow
workflows`).

An operator retires a version (removes it from `shared/domain/workflow.py`) only once no active
order uses it; these reports say when that is, and flag orders on a version this build lacks.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from shared.domain.states import TERMINAL_STATES
from shared.domain.workflow import WORKFLOWS, current_workflow
from shared.store.port import WorkflowUse


@dataclass
class VersionReport:
    workflow: str
    version: int
    registered: bool
    current: bool
    """New orders start on it."""
    newer: bool
    """Registered and newer than the current version (not rolled out yet)."""
    steps: list[str]
    active: int = 0
    """Orders not finished (Pending, Processing, Compensating, Error, CompensationFailed)."""
    finished: int = 0
    states: dict[str, int] = field(default_factory=dict)

    @property
    def retirable(self) -> bool:
        return self.registered and not self.current and not self.newer and self.active == 0

    @property
    def verdict(self) -> str:
        if not self.registered:
            return "UNKNOWN to this build: deploy a build that has it, then resubmit its orders"
        if self.current:
            return "current: new orders start on it"
        if self.newer:
            return f"ready: new orders start on it with ORDERFLOW_WORKFLOW_VERSION={self.version}"
        if self.active:
            return f"keep: {self.active} active order(s) still run on it"
        return "no active orders: may be retired"


def version_reports(usage: list[WorkflowUse], current_version: int | None) -> list[VersionReport]:
    """Every registered version and every version found in the store, oldest first."""
    current = current_workflow("order", current_version)
    reports: dict[tuple[str, int], VersionReport] = {}
    for wf in WORKFLOWS:
        reports[(wf.name, wf.version)] = VersionReport(
            wf.name,
            wf.version,
            registered=True,
            current=(wf.name, wf.version) == (current.name, current.version),
            newer=wf.name == current.name and wf.version > current.version,
            steps=[s.name for s in wf.steps],
        )
    counts: dict[tuple[str, int], dict[str, int]] = defaultdict(dict)
    for use in usage:
        key = (use.workflow, use.version)
        if key not in reports:
            reports[key] = VersionReport(
                use.workflow, use.version, registered=False, current=False, newer=False, steps=[]
            )
        report = reports[key]
        counts[key][use.state.value] = use.count
        if use.state in TERMINAL_STATES:
            report.finished += use.count
        else:
            report.active += use.count
    for key, states in counts.items():
        reports[key].states = dict(sorted(states.items()))
    return [reports[k] for k in sorted(reports)]
