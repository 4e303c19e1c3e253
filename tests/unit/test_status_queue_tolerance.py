"""Which differences of an application's own status queue submission binds it with: only those
that change how long the queue and its statuses last or how they reach the application, never
one that dead-letters, refuses our publishes or keeps statuses for good (a review's finding: a
`reject-publish` queue nobody reads nacked every status on the publishers' shared channels)."""

from __future__ import annotations

from typing import Any

import pytest

from shared.broker.declarations import Difference
from shared.broker.private import tolerated


@pytest.mark.parametrize(
    ("setting", "current", "bound"),
    [
        ("x-expires", 600_000, True),
        ("x-expires", None, True),
        ("auto_delete", True, True),
        ("x-max-length", 100, True),
        ("x-overflow", "drop-head", True),
        ("x-overflow", None, True),
        ("x-overflow", "reject-publish", False),
        ("x-overflow", "reject-publish-dlx", False),
        ("x-queue-type", "classic", True),
        ("x-queue-type", "quorum", True),
        ("x-queue-type", "stream", False),
        ("x-dead-letter-exchange", "orderflow.submit", False),
        ("x-dead-letter-routing-key", "orderflow.orders", False),
        ("x-something-new", 1, False),
    ],
)
def test_a_difference_is_tolerated_only_where_harmless(
    setting: str, current: Any, bound: bool
) -> None:
    assert tolerated(Difference(setting, wanted=None, current=current)) is bound
