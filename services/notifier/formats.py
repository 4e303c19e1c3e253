"""What each kind of target is sent for a notice (pure: no I/O, unit-tested with hypothesis).

A notice is one thing to tell about an alert: that it was raised (`trigger`), acknowledged or
resolved. Each kind of target has its own body:

- `webhook`: the alert as JSON with the event, who and when, and the PagerDuty dedup key;
- `slack`: an incoming webhook's `text` (the fallback shown in notifications) and `blocks`;
- `pagerduty`: an Events API v2 event; a trigger carries the alert as its `payload`, an
  acknowledge or resolve only the `dedup_key` of the incident it changes.

Every body holds no card number in clear (`redact_shown`, shared/domain/redaction.py): an alert
is masked when it is made, but one stored before that was not, and a body leaves the system.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

from shared.domain.journal import Alert, AlertAction, AlertState
from shared.domain.redaction import redact_shown

PAGERDUTY_SUMMARY_LIMIT = 1024
"""PagerDuty refuses a longer `payload.summary`."""
PAGERDUTY_KEY_LIMIT = 255
"""PagerDuty's limit on a `dedup_key`."""
SLACK_TEXT_LIMIT = 3000
"""Slack's limit on the text of one section block."""


class TargetKind(StrEnum):
    WEBHOOK = "webhook"
    """A generic JSON webhook."""
    SLACK = "slack"
    """A Slack-compatible incoming webhook."""
    PAGERDUTY = "pagerduty"
    """PagerDuty's Events API v2."""


class Event(StrEnum):
    """What a notice tells (PagerDuty's `event_action` names)."""

    TRIGGER = "trigger"
    """The alert was raised."""
    ACKNOWLEDGE = "acknowledge"
    RESOLVE = "resolve"


@dataclass(frozen=True)
class Notice:
    """One thing to tell the targets about an alert of the hub `hub`."""

    hub: str
    alert: Alert
    event: Event = Event.TRIGGER
    by: str | None = None
    """Who acknowledged or resolved it (None for a trigger)."""
    at: datetime | None = None
    """When it was acknowledged or resolved (None for a trigger)."""

    @property
    def key(self) -> str:
        """What a target's deliveries are deduplicated by: the alert and the event (the same
        alert raised twice is sent once; its acknowledgement is sent once more)."""
        return f"{self.alert.alert_id}/{self.event.value}"

    @property
    def dedup_key(self) -> str:
        """PagerDuty's incident key: the same for every alert of one kind about one order
        (a repeat adds to the open incident instead of opening another), the alert's own id for
        an alert about no order; prefixed by the hub, so two hubs never share an incident."""
        alert = self.alert
        subject = f"order/{alert.order_id}" if alert.order_id else f"alert/{alert.alert_id}"
        return f"{self.hub}/{alert.kind.value}/{subject}"[:PAGERDUTY_KEY_LIMIT]


def notices_of(hub: str, alert: Alert, state: AlertState) -> list[Notice]:
    """The acknowledgement and resolution recorded in `state`, as notices (in that order)."""
    return [
        Notice(hub, alert, Event(action.value), state.by(action), at)
        for action in (AlertAction.ACKNOWLEDGE, AlertAction.RESOLVE)
        if (at := state.at(action)) is not None
    ]


def body(kind: TargetKind, notice: Notice, *, routing_key: str | None = None) -> dict[str, Any]:
    """The JSON a target of `kind` is sent for `notice` (PagerDuty's needs its routing key)."""
    if kind is TargetKind.SLACK:
        return slack_body(notice)
    if kind is TargetKind.PAGERDUTY:
        if routing_key is None:
            raise ValueError("a PagerDuty event needs its routing key")
        return pagerduty_body(notice, routing_key)
    return webhook_body(notice)


def webhook_body(notice: Notice) -> dict[str, Any]:
    body = {
        "event": notice.event.value,
        "hub": notice.hub,
        "alert": notice.alert.model_dump(mode="json"),
        "dedup_key": notice.dedup_key,
        "by": notice.by,
        "at": notice.at.isoformat() if notice.at is not None else None,
    }
    masked: dict[str, Any] = redact_shown(body)
    return masked


def _slack_escaped(text: str) -> str:
    """Text as Slack shows it literally (its markup reads &, < and > as control characters)."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def slack_text(notice: Notice) -> str:
    """The one-line text of a notice (Slack's fallback, shown in notifications), masked."""
    return redact_shown(_slack_line(notice))


def _slack_line(notice: Notice) -> str:
    alert = notice.alert
    about = f" order {alert.order_id}" if alert.order_id else ""
    if notice.event is Event.TRIGGER:
        head = f"[{alert.severity.value}] {alert.kind.value}{about}"
        return f"{head}: {alert.message}"
    done = "acknowledged" if notice.event is Event.ACKNOWLEDGE else "resolved"
    return f"{done} by {notice.by or 'someone'}: {alert.kind.value}{about} ({alert.alert_id})"


def slack_body(notice: Notice) -> dict[str, Any]:
    alert = notice.alert
    text = _slack_escaped(slack_text(notice))
    context = [
        f"hub {notice.hub}",
        f"alert {alert.alert_id}",
        f"raised {alert.at.isoformat()}",
        *([f"by {alert.source}"] if alert.source else []),
    ]
    # Masked before the cut, which could leave the first digits of a card it halves.
    context_text = _slack_escaped(redact_shown(" · ".join(context)))
    return {
        "text": text,
        "blocks": [
            {"type": "section", "text": {"type": "mrkdwn", "text": text[:SLACK_TEXT_LIMIT]}},
            {
                "type": "context",
                "elements": [
                    {
                        "type": "mrkdwn",
                        "text": context_text[:SLACK_TEXT_LIMIT],
                    }
                ],
            },
        ],
    }


def pagerduty_body(notice: Notice, routing_key: str) -> dict[str, Any]:
    """The event, masked but for its routing key (a secret of 32 characters, which may hold
    a run of digits that the masking would take for a card number)."""
    return {"routing_key": routing_key, **redact_shown(_pagerduty_event(notice))}


def _pagerduty_event(notice: Notice) -> dict[str, Any]:
    event: dict[str, Any] = {
        "event_action": notice.event.value,
        "dedup_key": notice.dedup_key,
    }
    if notice.event is not Event.TRIGGER:
        return event
    alert = notice.alert
    summary = f"{alert.kind.value}: {alert.message}" if alert.message else alert.kind.value
    summary = redact_shown(summary)  # before the cut, which could halve a card number
    details = {
        "alert_id": alert.alert_id,
        "hub": notice.hub,
        "order_id": alert.order_id,
        "data": alert.model_dump(mode="json")["data"],
    }
    event["payload"] = {
        "summary": summary[:PAGERDUTY_SUMMARY_LIMIT],
        "source": alert.source or f"orderflow/{notice.hub}",
        "severity": alert.severity.value,
        "timestamp": alert.at.isoformat(),
        "group": notice.hub,
        "class": alert.kind.value,
        "custom_details": details,
    }
    return event
