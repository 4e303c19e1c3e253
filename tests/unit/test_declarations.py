"""Reading the broker's refusal of a declaration (shared/broker/declarations.py), in RabbitMQ's
own words as 3.10 says them (captured from the tests' server)."""

from __future__ import annotations

from typing import Any

import pytest

from shared.broker.declarations import Unreadable, difference

Q = "for queue 't1.status.guest.abc' in vhost '/'"


@pytest.mark.parametrize(
    ("said", "setting", "current"),
    [
        (
            f"inequivalent arg 'x-expires' {Q}: received '300000' but current is '600000'",
            "x-expires",
            600_000,
        ),
        (
            f"inequivalent arg 'durable' {Q}: received 'false' but current is 'true'",
            "durable",
            True,
        ),
        (
            f"inequivalent arg 'auto_delete' {Q}: received 'true' but current is 'false'",
            "auto_delete",
            False,
        ),
        (
            f"inequivalent arg 'x-expires' {Q}: received the value '300000' of type 'signedint' "
            "but current is none",
            "x-expires",
            None,
        ),
        (
            f"inequivalent arg 'x-dead-letter-exchange' {Q}: received none but current is the "
            "value 'amq.fanout' of type 'longstr'",
            "x-dead-letter-exchange",
            "amq.fanout",
        ),
        (
            f"inequivalent arg 'x-max-length' {Q}: received none but current is the value '3' "
            "of type 'byte'",
            "x-max-length",
            3,
        ),
        (
            f"inequivalent arg 'x-single-active-consumer' {Q}: received none but current is "
            "the value 'true' of type 'bool'",
            "x-single-active-consumer",
            True,
        ),
    ],
)
def test_a_refusal_names_the_setting_and_the_queue_s_value_of_it(
    said: str, setting: str, current: Any
) -> None:
    assert difference(f"PRECONDITION_FAILED - {said}") == (setting, current)


@pytest.mark.parametrize(
    "said",
    [
        "RESOURCE_LOCKED - cannot obtain exclusive access to locked queue 'q' in vhost '/'",
        f"inequivalent arg 'x-odd' {Q}: received none but current is the value '1.5' "
        "of type 'decimal'",
        "PRECONDITION_FAILED - invalid arg 'x-expires' for queue 'q': \"expected integer\"",
    ],
)
def test_a_refusal_that_names_no_readable_difference_is_unreadable(said: str) -> None:
    with pytest.raises(Unreadable):
        difference(said)
