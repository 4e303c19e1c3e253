"""The notifier (`orderflow serve notifier`): every alert of `<hub>.alerts.feed`, and every
acknowledgement and resolution an operator records, delivered to the configured webhooks.

| module        | what it is                                                                |
|---------------|---------------------------------------------------------------------------|
| `formats.py`  | what each kind of target is sent: generic JSON, Slack, PagerDuty Events v2 |
| `targets.py`  | the targets the settings configure                                        |
| `sending.py`  | one delivery to one target: HTTP, retries with backoff, dedupe, give-up    |
| `service.py`  | the process: the feed's consumer, the watcher of alert states, dead letters |
"""
