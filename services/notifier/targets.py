"""The notification targets the settings configure (at most one of each kind)."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

from pydantic import SecretStr

from services.notifier.formats import Notice, TargetKind, body
from shared.config import NotifierSettings
from shared.errors import ConfigurationError


@dataclass(frozen=True)
class Target:
    """One webhook the notifier delivers to. Its URL (and PagerDuty's routing key) may carry a
    secret: neither is ever shown (`shown` names the target by its kind and host)."""

    kind: TargetKind
    url: SecretStr
    routing_key: SecretStr | None = None

    @property
    def name(self) -> str:
        """The target in logs, metrics, dead letters and the inbox."""
        return self.kind.value

    @property
    def shown(self) -> str:
        return f"{self.kind.value} ({urlsplit(self.url.get_secret_value()).hostname or '?'})"

    def body(self, notice: Notice) -> dict[str, object]:
        key = self.routing_key.get_secret_value() if self.routing_key is not None else None
        return body(self.kind, notice, routing_key=key)


def _checked(kind: TargetKind, url: SecretStr) -> SecretStr:
    parts = urlsplit(url.get_secret_value())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigurationError(
            f"the {kind.value} target's URL is not an http(s) URL with a host (its setting "
            f"ORDERFLOW_NOTIFY_{'PAGERDUTY' if kind is TargetKind.PAGERDUTY else kind.name}_URL)"
        )
    return url


def _given(value: SecretStr | None) -> SecretStr | None:
    """A secret's value without surrounding blanks (a file's last newline), None when unset or
    empty (compose's secret file as `infra/secrets.sh` writes it)."""
    text = value.get_secret_value().strip() if value is not None else ""
    return SecretStr(text) if text else None


def targets_of(settings: NotifierSettings) -> list[Target]:
    """Every target the settings name; a URL that is not http(s) is a configuration error."""
    found: list[Target] = []
    webhook = _given(settings.notify_webhook_url)
    slack = _given(settings.notify_slack_url)
    routing_key = _given(settings.notify_pagerduty_routing_key)
    if webhook is not None:
        found.append(Target(TargetKind.WEBHOOK, _checked(TargetKind.WEBHOOK, webhook)))
    if slack is not None:
        found.append(Target(TargetKind.SLACK, _checked(TargetKind.SLACK, slack)))
    if routing_key is not None:
        url = _checked(TargetKind.PAGERDUTY, SecretStr(settings.notify_pagerduty_url))
        found.append(Target(TargetKind.PAGERDUTY, url, routing_key))
    return found
