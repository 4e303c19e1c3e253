"""Settings (DESIGN §2): read from the environment, prefix `ORDERFLOW_`, once, in a bootstrap.

`Settings` is the composition of the sections (shared/config/connections.py, components.py,
edges.py): `settings.broker.prefetch`, `settings.workflow.step_timeout_s`; every component takes
the section it uses. The environment's names are those of old, `ORDERFLOW_<FIELD>`, whichever
section holds the field; and a flat `name=value` (`load_settings(prefetch=5)`, `Settings(hub=…)`,
`settings.replace(prefetch=5)`) goes to the section that holds `name`.

`load_settings` also reads a `.env` file (the one docker compose reads), `.env` in the current
directory or the file `ORDERFLOW_ENV_FILE` names: only its `ORDERFLOW_*` lines, and a real
environment variable wins over the file's line. Beside it, the local credentials `orderflow up`
made (`CREDENTIALS_FILE`) are read the same way, `.env` winning over them; docker compose never
reads that file (its containers get their secrets as files). (The one way a URL is shown,
credentials masked, is `shared.masking.mask_credentials`.)
"""

from __future__ import annotations

import os
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator
from pydantic.fields import FieldInfo

from shared.config.base import Section
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
from shared.domain.messages import validation_problems
from shared.errors import ConfigurationError


class Settings(BaseModel):
    """Every setting of every process, by section; the hub, which every component names its
    queues and records by, at the top."""

    model_config = ConfigDict(frozen=True)

    hub: str
    store: StoreSettings
    broker: BrokerSettings
    process: ProcessSettings
    remote: RemoteSettings
    workflow: WorkflowSettings
    supervisor: SupervisorSettings
    agents: AgentSettings
    scheduler: SchedulerSettings
    submission: SubmissionSettings
    retention: RetentionSettings
    observability: ObservabilitySettings
    notifier: NotifierSettings
    api: ApiSettings
    stand_in: RemoteStandInSettings
    drills: DrillSettings

    def __init__(self, **values: Any) -> None:
        """Each section read from the environment, with the flat `name=value`s given in place
        (`_env_file` and the other `_`-options of a `BaseSettings` go to every section)."""
        super().__init__(**_sectioned(values))

    @model_validator(mode="after")
    def _claim_outlasts_step(self) -> Settings:
        if self.broker.inbox_claim_ttl_s < self.workflow.step_timeout_s:
            # A step request redelivered after its agent died is then taken over only once its
            # deadline has passed, when an agent makes no call: no allowance is spent twice.
            raise ValueError(
                "ORDERFLOW_INBOX_CLAIM_TTL_S must be at least ORDERFLOW_STEP_TIMEOUT_S, or a step "
                "request redelivered after its agent died could spend its allowance again"
            )
        return self

    def replace(self, **values: object) -> Settings:
        """These settings with the flat `name=value`s in place, unvalidated (as `model_copy`)."""
        changes: dict[str, Any] = {}
        for name, value in values.items():
            section = _owner(name)
            if section == "hub":
                changes["hub"] = value
                continue
            current = changes.get(section, getattr(self, section))
            changes[section] = current.model_copy(update={name: value})
        return self.model_copy(update=changes)


SECTIONS: dict[str, type[Section]] = {
    "hub": HubSettings,
    "store": StoreSettings,
    "broker": BrokerSettings,
    "process": ProcessSettings,
    "remote": RemoteSettings,
    "workflow": WorkflowSettings,
    "supervisor": SupervisorSettings,
    "agents": AgentSettings,
    "scheduler": SchedulerSettings,
    "submission": SubmissionSettings,
    "retention": RetentionSettings,
    "observability": ObservabilitySettings,
    "notifier": NotifierSettings,
    "api": ApiSettings,
    "stand_in": RemoteStandInSettings,
    "drills": DrillSettings,
}
"""Each section of `Settings` and its model (`hub`'s is read into `Settings.hub`)."""

OWNERS: dict[str, str] = {
    name: section for section, model in SECTIONS.items() for name in model.model_fields
}
"""Flat setting name (`prefetch`) -> the section that holds it (`broker`)."""

FIELDS: dict[str, FieldInfo] = {
    name: SECTIONS[section].model_fields[name] for name, section in OWNERS.items()
}
"""Every setting by its flat name (`ORDERFLOW_<NAME>` upper-cased), with its default and doc."""


def _owner(name: str) -> str:
    try:
        return OWNERS[name]
    except KeyError:
        raise TypeError(f"no setting {name!r}") from None


def _sectioned(values: dict[str, Any]) -> dict[str, Any]:
    options = {k: v for k, v in values.items() if k.startswith("_")}
    given: dict[str, dict[str, Any]] = {section: {} for section in SECTIONS}
    built: dict[str, Any] = {}
    for name, value in values.items():
        if name.startswith("_"):
            continue
        if name in SECTIONS and name != "hub" and isinstance(value, Section):
            built[name] = value  # a section already read (a copy's, a validation's)
        else:
            given[_owner(name)][name] = value
    for section, model in SECTIONS.items():
        if section not in built:
            built[section] = model(**options, **given[section])
    built["hub"] = built["hub"].hub if isinstance(built["hub"], HubSettings) else built["hub"]
    return built


ENV_FILE_VARIABLE = "ORDERFLOW_ENV_FILE"
DEFAULT_ENV_FILE = ".env"
CREDENTIALS_FILE = ".orderflow-credentials.env"
"""The local development credentials `orderflow up` makes on its first run (the remote
stand-in's operator token, the shop's and the console's logins), beside the `.env` file."""


def env_file() -> str | None:
    """The `.env` file the settings are read from: `ORDERFLOW_ENV_FILE`'s (which must exist),
    else `.env` in the current directory if there is one, else none."""
    named = os.environ.get(ENV_FILE_VARIABLE)
    if named:
        if not os.path.isfile(named):
            raise ConfigurationError(f"{ENV_FILE_VARIABLE}: no file {named!r}")
        return named
    return DEFAULT_ENV_FILE if os.path.isfile(DEFAULT_ENV_FILE) else None


def credentials_file() -> str:
    """Where `orderflow up` keeps its local credentials: `CREDENTIALS_FILE` in the directory of
    the file `ORDERFLOW_ENV_FILE` names, else in the current directory (beside `.env`)."""
    named = os.environ.get(ENV_FILE_VARIABLE)
    return os.path.join(os.path.dirname(named) if named else "", CREDENTIALS_FILE)


def env_files() -> tuple[str, ...]:
    """The files settings are read from, the one that wins last: the local credentials (if
    `orderflow up` made them), then the `.env` file (`env_file`)."""
    path = credentials_file()
    found: tuple[str, ...] = ()
    if os.path.isfile(path):
        if not os.access(path, os.R_OK):
            raise ConfigurationError(
                f"cannot read the local credentials in {path!r} (made by another user's "
                "`orderflow up`, e.g. under sudo?): delete it, or run as its owner"
            )
        found = (path,)
    named = env_file()
    return (*found, named) if named else found


def load_settings(**overrides: object) -> Settings:
    """Read the environment (and the `.env` file) once; a bad value becomes a one-line
    `ConfigurationError`. `overrides` are flat names (`prefetch=5`), each read in place of its
    variable and validated like it."""
    try:
        # extra="ignore": the files' other keys (compose's own, COMPOSE_PROFILES, SECRETS_DIR)
        # are not read; the environment wins over the files, and a later file over an earlier
        # one (pydantic-settings' order).
        return Settings(_env_file=env_files(), **overrides)
    except ValidationError as exc:
        loc, msg = validation_problems(exc)[0]
        field = ".".join(str(p) for p in loc)
        env = f"ORDERFLOW_{field.upper()}" if field else "settings"
        message = msg.removeprefix("Value error, ")
        raise ConfigurationError(f"{env}: {message}") from None
