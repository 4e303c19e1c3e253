"""Broker URL lists (shared/broker/urls.py): what a setting accepts, the clear error for what it
does not, passwords never printed, and the order in which a process tries a cluster's nodes."""

from __future__ import annotations

import random

import pytest

from shared.broker.seal import seal_key
from shared.broker.urls import NodeRotation, broker_urls, first_url, login_user
from shared.config import OWNERS, load_settings
from shared.errors import ConfigurationError

A = "amqp://app:s3cret@rabbit-1:5672/shop"
B = "amqp://app:s3cret@rabbit-2:5672/shop"
C = "amqp://app:s3cret@rabbit-3:5672/shop"


def test_one_url_is_a_list_of_one() -> None:
    assert broker_urls("amqp://guest:guest@localhost:5672/") == (
        "amqp://guest:guest@localhost:5672/",
    )


def test_a_list_keeps_its_order_and_drops_spaces() -> None:
    assert broker_urls(f"{A}, {B} ,{C}") == (A, B, C)


def test_default_ports_and_tls_are_accepted() -> None:
    urls = "amqps://app:pw@rabbit-1/shop,amqps://app:pw@rabbit-2:5671/other%2Fshop"
    with pytest.raises(ValueError, match="another virtual host"):
        broker_urls(urls)
    assert len(broker_urls("amqps://app:pw@rabbit-1/shop,amqps://app:pw@rabbit-2/shop")) == 2


@pytest.mark.parametrize(
    ("value", "error"),
    [
        (f"{A},,{B}", "empty item"),
        (f"{A},", "empty item"),
        (f"{A},rabbit-2:5672", r"item 2 \(rabbit-2:5672\) .* whole URL"),
        (f"{A},http://app:s3cret@rabbit-2/shop", "item 2 .* must look like amqp://"),
        ("amqp://app:s3cret@rabbit-1:56x2/shop", "port '56x2' is not a port number"),
        (f"{A},amqp://app:s3cret@rabbit-2:99999/shop", "port '99999' is not a port number"),
        (f"{A},amqp://app:s3cret@rabbit-1/shop", "names the node of item 1 again"),
        (f"{A},amqp://other:s3cret@rabbit-2:5672/shop", "another user than item 1"),
        (f"{A},amqp://app:typo@rabbit-2:5672/shop", "another password than item 1"),
        (f"{A},amqp://app:s3cret@rabbit-2:5672/", "another virtual host than item 1"),
        ("amqp:///shop", "must look like amqp://user:password@host:5672/vhost"),
    ],
)
def test_a_bad_list_is_a_clear_error(value: str, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        broker_urls(value)


@pytest.mark.parametrize("setting", ["rabbitmq_url", "api_operator_rabbitmq_url"])
def test_settings_name_the_variable_and_never_the_password(setting: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        load_settings(**{setting: f"{A},amqp://app:typo@rabbit-2/shop"})
    message = str(caught.value)
    assert message.startswith(f"ORDERFLOW_{setting.upper()}: item 2 (amqp://***:***@rabbit-2")
    assert "s3cret" not in message and "typo" not in message
    assert (
        getattr(getattr(load_settings(**{setting: f"{A},{B}"}), OWNERS[setting]), setting)
        == f"{A},{B}"
    )


def test_the_user_and_seal_of_a_list_are_those_of_each_url() -> None:
    assert first_url(f"{A} ,{B}") == A
    assert login_user(f"{A},{B}") == "app"
    one = seal_key(load_settings(rabbitmq_url=A).broker)
    assert one is not None
    assert seal_key(load_settings(rabbitmq_url=f"{A},{B},{C}").broker) == one
    assert seal_key(load_settings(rabbitmq_url=f"{B},{A}").broker) == one


def test_rotation_starts_at_random_then_goes_round() -> None:
    rotation = NodeRotation((A, B, C), rng=random.Random(7))
    first = rotation.next()
    start = (A, B, C).index(first)
    tried = [first] + [rotation.next() for _ in range(5)]
    assert tried == [(A, B, C)[(start + i) % 3] for i in range(6)]
    assert rotation.current == tried[-1]


def test_rotation_spreads_a_fleet_over_the_nodes() -> None:
    rng = random.Random(1)
    starts = [NodeRotation((A, B, C), rng=rng).next() for _ in range(300)]
    assert {url: starts.count(url) for url in (A, B, C)} == {
        url: pytest.approx(100, abs=30) for url in (A, B, C)
    }


def test_a_single_node_is_always_the_one() -> None:
    rotation = NodeRotation((A,))
    assert [rotation.next() for _ in range(3)] == [A, A, A]
    with pytest.raises(ValueError):
        NodeRotation(())
