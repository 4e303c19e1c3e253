"""What each kind of target is sent (services/notifier/formats.py), the targets the settings
configure, and a `Retry-After` read."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import SecretStr

from services.notifier.formats import (
    PAGERDUTY_KEY_LIMIT,
    PAGERDUTY_SUMMARY_LIMIT,
    Event,
    Notice,
    TargetKind,
    body,
    notices_of,
)
from services.notifier.sending import retry_after
from services.notifier.targets import targets_of
from shared.config import Settings
from shared.domain.journal import Alert, AlertAction, AlertKind, AlertState, Severity
from shared.errors import ConfigurationError

T = datetime(2026, 12, 4, 7, 0, tzinfo=UTC)

alerts = st.builds(
    Alert,
    alert_id=st.text(min_size=1, max_size=300),
    kind=st.sampled_from(AlertKind),
    severity=st.sampled_from(Severity),
    message=st.text(max_size=2500),
    at=st.just(T),
    order_id=st.none() | st.text(min_size=1, max_size=250),
    source=st.none() | st.text(max_size=50),
    data=st.dictionaries(st.text(max_size=10), st.integers() | st.text(max_size=20), max_size=3),
)


def alert(alert_id: str = "a-1", order_id: str | None = "o-1", **kw: object) -> Alert:
    fields: dict[str, object] = {
        "alert_id": alert_id,
        "kind": AlertKind.ORDER_ERROR,
        "severity": Severity.CRITICAL,
        "message": "order o-1 in Error <@channel> & more",
        "at": T,
        "order_id": order_id,
        "source": "scheduler",
        "data": {"step": "payment.charge"},
    }
    return Alert.model_validate(fields | kw)


@given(alerts, st.sampled_from(Event), st.sampled_from(TargetKind))
def test_every_body_is_json_within_its_targets_limits(
    a: Alert, event: Event, kind: TargetKind
) -> None:
    notice = Notice("hub", a, event, "ann" if event is not Event.TRIGGER else None)
    sent = body(kind, notice, routing_key="rk")
    json.dumps(sent)  # JSON as it goes on the wire
    if kind is TargetKind.PAGERDUTY:
        assert sent["event_action"] == event.value and sent["routing_key"] == "rk"
        assert 0 < len(sent["dedup_key"]) <= PAGERDUTY_KEY_LIMIT
        if event is Event.TRIGGER:
            payload = sent["payload"]
            assert 0 < len(payload["summary"]) <= PAGERDUTY_SUMMARY_LIMIT
            assert payload["severity"] in ("critical", "error", "warning", "info")
            assert payload["source"] and datetime.fromisoformat(payload["timestamp"]) == T
            assert payload["custom_details"]["alert_id"] == a.alert_id
        else:
            assert "payload" not in sent  # an acknowledge or resolve names its incident only
    elif kind is TargetKind.SLACK:
        assert sent["text"] and all(
            len(b.get("text", {}).get("text", "")) <= 3000 for b in sent["blocks"]
        )
        # Slack's control characters come only escaped: a message cannot ping or link.
        assert "<" not in sent["text"] and ">" not in sent["text"]
    else:
        assert sent["alert"]["alert_id"] == a.alert_id and sent["event"] == event.value


@given(alerts, alerts)
def test_pagerdutys_dedup_key_is_the_kind_and_order_of_an_alert(a: Alert, b: Alert) -> None:
    same = a.kind == b.kind and a.order_id == b.order_id and a.order_id is not None
    key_a, key_b = Notice("h", a).dedup_key, Notice("h", b).dedup_key
    if same:
        assert key_a == key_b
    if a.order_id is None and b.order_id is None and a.alert_id != b.alert_id:
        assert key_a != key_b or len(key_a) == PAGERDUTY_KEY_LIMIT
    # Another hub never shares an incident.
    assert Notice("h2", a).dedup_key != key_a or len(key_a) == PAGERDUTY_KEY_LIMIT


def test_the_three_formats_of_one_alert() -> None:
    notice = Notice("shop", alert())
    generic = body(TargetKind.WEBHOOK, notice)
    assert generic["event"] == "trigger" and generic["alert"]["order_id"] == "o-1"
    assert generic["dedup_key"] == "shop/order-error/order/o-1"
    slack = body(TargetKind.SLACK, notice)
    assert slack["text"] == (
        "[critical] order-error order o-1: order o-1 in Error &lt;@channel&gt; &amp; more"
    )
    assert [b["type"] for b in slack["blocks"]] == ["section", "context"]
    pd = body(TargetKind.PAGERDUTY, notice, routing_key="rk")
    assert pd["payload"] | {"custom_details": None} == {
        "summary": "order-error: order o-1 in Error <@channel> & more",
        "source": "scheduler",
        "severity": "critical",
        "timestamp": T.isoformat(),
        "group": "shop",
        "class": "order-error",
        "custom_details": None,
    }
    assert pd["payload"]["custom_details"]["data"] == {"step": "payment.charge"}
    with pytest.raises(ValueError, match="routing key"):
        body(TargetKind.PAGERDUTY, notice)


def test_an_acknowledgement_and_a_resolution_are_notices_with_who_and_when() -> None:
    a = alert()
    state = AlertState(alert_id="a-1")
    assert notices_of("h", a, state) == []
    state = state.with_action(AlertAction.ACKNOWLEDGE, by="ann", at=T)
    state = state.with_action(AlertAction.ACKNOWLEDGE, by="bob", at=T + timedelta(1))
    state = state.with_action(AlertAction.RESOLVE, by="bob", at=T + timedelta(2))
    ack, resolve = notices_of("h", a, state)
    assert (ack.event, ack.by, ack.at) == (Event.ACKNOWLEDGE, "ann", T)
    assert (resolve.event, resolve.by) == (Event.RESOLVE, "bob")
    assert ack.key == "a-1/acknowledge" and ack.dedup_key == Notice("h", a).dedup_key
    assert "acknowledged by ann" in body(TargetKind.SLACK, ack)["text"]
    assert body(TargetKind.WEBHOOK, resolve)["by"] == "bob"


def test_targets_come_from_the_settings_and_never_show_their_secrets() -> None:
    assert targets_of(Settings().notifier) == []
    settings = Settings(
        notify_webhook_url=SecretStr("https://hooks.example/x?token=s3cret\n"),
        notify_slack_url=SecretStr(""),  # a secret file written empty: unset
        notify_pagerduty_routing_key=SecretStr("rk-s3cret"),
    )
    targets = targets_of(settings.notifier)
    assert [t.name for t in targets] == ["webhook", "pagerduty"]
    assert targets[0].url.get_secret_value() == "https://hooks.example/x?token=s3cret"
    assert targets[0].shown == "webhook (hooks.example)"
    assert "s3cret" not in repr(targets) + repr(settings)
    with pytest.raises(ConfigurationError, match="ORDERFLOW_NOTIFY_SLACK_URL"):
        targets_of(Settings(notify_slack_url=SecretStr("hooks.example/x")).notifier)


@pytest.mark.parametrize(
    ("header", "seconds"),
    [("7", 7.0), ("0", 0.0), (None, None), ("", None), ("soon", None), ("-3", None)],
)
def test_retry_after_in_seconds(header: str | None, seconds: float | None) -> None:
    assert retry_after(header) == seconds


def test_retry_after_as_an_http_date() -> None:
    later = datetime.now(UTC) + timedelta(seconds=30)
    waited = retry_after(later.strftime("%a, %d %b %Y %H:%M:%S GMT"))
    assert waited is not None and 25 <= waited <= 31
    assert retry_after("Mon, 01 Jan 2001 00:00:00 GMT") == 0.0
