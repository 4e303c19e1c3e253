"""Settings by section (DESIGN §2): `Settings` composes the sections each component takes.

`shared.config.settings` composes and loads them; the sections are in `connections` (the hub,
the store, the broker, the remote service, every process), `components` (the workflow, the
supervisor, the agents, the scheduler, submission, retention) and `edges` (observability, the
notifier, the API, the remote stand-in, the drills).
"""

from shared.config.components import (
    AgentSettings,
    RetentionSettings,
    SchedulerSettings,
    SubmissionSettings,
    SupervisorSettings,
    WorkflowSettings,
)
from shared.config.connections import (
    BrokerSettings,
    HubSettings,
    ProcessSettings,
    RemoteSettings,
    StoreSettings,
)
from shared.config.edges import (
    ApiSettings,
    DrillSettings,
    NotifierSettings,
    ObservabilitySettings,
    RemoteStandInSettings,
)
from shared.config.settings import (
    FIELDS,
    OWNERS,
    SECTIONS,
    Settings,
    credentials_file,
    env_file,
    env_files,
    load_settings,
)

__all__ = [
    "FIELDS",
    "OWNERS",
    "SECTIONS",
    "AgentSettings",
    "ApiSettings",
    "BrokerSettings",
    "DrillSettings",
    "HubSettings",
    "NotifierSettings",
    "ObservabilitySettings",
    "ProcessSettings",
    "RemoteSettings",
    "RemoteStandInSettings",
    "RetentionSettings",
    "SchedulerSettings",
    "Settings",
    "StoreSettings",
    "SubmissionSettings",
    "SupervisorSettings",
    "WorkflowSettings",
    "credentials_file",
    "env_file",
    "env_files",
    "load_settings",
]
