from __future__ import annotations

import pytest

from deployment.envfile import LAYOUT
from shared import crash, policies
from shared.config import FIELDS, SECTIONS, Settings, load_settings
from shared.domain.states import ErrorKind
from shared.domain.workflow import get_workflow
from shared.errors import ConfigurationError


def test_defaults_follow_the_design(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (
        "ORDERFLOW_RABBITMQ_URL",
        "ORDERFLOW_STORE_URL",
        "ORDERFLOW_HUB",
        "ORDERFLOW_REMOTE_URL",
    ):
        monkeypatch.delenv(name, raising=False)
    s = load_settings()
    assert s.broker.rabbitmq_url == "amqp://guest:guest@localhost:5672/"
    assert s.store.store_url == "mongodb://localhost:27017"
    assert (s.hub, s.store.store_kind, s.remote.remote_url) == (
        "orderflow",
        "mongodb",
        "http://127.0.0.1:8080",
    )


def test_environment_overrides(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ORDERFLOW_STORE_URL", "postgresql://u@db/x")
    monkeypatch.setenv("ORDERFLOW_HUB", "shop2")
    monkeypatch.setenv("ORDERFLOW_STEP_TIMEOUT_S", "2.5")
    s = load_settings()
    assert (s.store.store_kind, s.hub, s.workflow.step_timeout.total_seconds()) == (
        "postgresql",
        "shop2",
        2.5,
    )


@pytest.mark.parametrize(
    ("env", "value", "says"),
    [
        ("ORDERFLOW_STORE_URL", "redis://x", "ORDERFLOW_STORE_URL"),
        ("ORDERFLOW_STORE_URL", "postgresql://h:port/x", "not a number"),
        ("ORDERFLOW_RABBITMQ_URL", "http://x", "ORDERFLOW_RABBITMQ_URL"),
        ("ORDERFLOW_HUB", "Has Spaces", "ORDERFLOW_HUB"),
        ("ORDERFLOW_PREFETCH", "0", "ORDERFLOW_PREFETCH"),
        ("ORDERFLOW_HANDLER_TIMEOUT_S", "99", "INBOX_CLAIM_TTL_S"),
        ("ORDERFLOW_STEP_TIMEOUT_S", "31", "allowance again"),
    ],
)
def test_bad_values_become_one_line_configuration_errors(
    monkeypatch: pytest.MonkeyPatch, env: str, value: str, says: str
) -> None:
    monkeypatch.setenv(env, value)
    with pytest.raises(ConfigurationError) as caught:
        load_settings()
    assert says in str(caught.value)
    assert "\n" not in str(caught.value)


def test_settings_are_not_read_at_import_time() -> None:
    import shared.config as config

    assert not any(isinstance(v, Settings) for v in vars(config).values())


def test_which_failures_compensate_is_set_per_workflow(monkeypatch: pytest.MonkeyPatch) -> None:
    def compensates(kind: ErrorKind, version: int = 1) -> bool:
        workflow = get_workflow("order", version)
        assert workflow is not None
        return policies.compensates(load_settings().workflow, workflow, kind)

    # Unset: the workflow's own policy (a declined payment compensates; a spent budget and an
    # outage past the threshold park).
    monkeypatch.delenv("ORDERFLOW_COMPENSATE_ON", raising=False)
    assert compensates(ErrorKind.PERMANENT)
    assert not compensates(ErrorKind.BUDGET_EXHAUSTED)
    assert not compensates(ErrorKind.RECOVERY_LIMIT)
    monkeypatch.setenv("ORDERFLOW_COMPENSATE_ON", "permanent,recovery-limit")
    assert compensates(ErrorKind.RECOVERY_LIMIT, version=2) and compensates(ErrorKind.PERMANENT)
    monkeypatch.setenv("ORDERFLOW_COMPENSATE_ON", "budget-exhausted;order=")
    assert not compensates(ErrorKind.PERMANENT) and not compensates(ErrorKind.BUDGET_EXHAUSTED)
    monkeypatch.setenv("ORDERFLOW_COMPENSATE_ON", "order=permanent,budget-exhausted")
    assert compensates(ErrorKind.BUDGET_EXHAUSTED) and not compensates(ErrorKind.RECOVERY_LIMIT)


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("transient", "'transient' cannot compensate"),
        ("shop=permanent", "'shop' is not a workflow"),
        ("order=permanent;order=", "given twice"),
    ],
)
def test_a_compensation_policy_that_cannot_take_effect_is_refused(
    monkeypatch: pytest.MonkeyPatch, value: str, says: str
) -> None:
    monkeypatch.setenv("ORDERFLOW_COMPENSATE_ON", value)
    with pytest.raises(ConfigurationError, match=says):
        load_settings()


def test_the_crash_drill_knows_its_points(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ORDERFLOW_FAULT_CRASH_AT", "mid-air")
    with pytest.raises(ConfigurationError, match="ORDERFLOW_FAULT_CRASH_AT"):
        load_settings()
    with pytest.raises(ValueError, match="unknown crash point"):
        crash.arm("mid-air")
    crash.arm("after-claim", 2)
    assert crash.armed("after-claim") and not crash.armed("after-request")
    crash.crash_point("after-claim")  # the first of two: still alive
    crash.arm(None)
    assert not crash.armed("after-claim")


def test_every_setting_is_in_one_section_under_its_old_name() -> None:
    listed = [name for _, names in LAYOUT for name in names]
    assert sorted(listed) == sorted(FIELDS), ".env.example's layout lists every setting once"
    sections = [set(model.model_fields) for model in SECTIONS.values()]
    assert sum(len(fields) for fields in sections) == len(set().union(*sections)) == len(FIELDS)


def test_flat_names_go_to_their_sections(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ORDERFLOW_PREFETCH", "7")
    s = load_settings(hub="shop3", step_timeout_s=3, fault_crash_at="after-claim")
    assert (s.hub, s.broker.prefetch, s.workflow.step_timeout_s) == ("shop3", 7, 3)
    assert s.drills.fault_crash_at == "after-claim"
    changed = s.replace(prefetch=9, hub="shop4")
    assert (changed.hub, changed.broker.prefetch, s.broker.prefetch) == ("shop4", 9, 7)
    with pytest.raises(TypeError, match="no setting 'prefech'"):
        load_settings(prefech=9)
