"""The application contract's AsyncAPI document (shared/broker/asyncapi.py): the committed copy
is the code's, and it says what the code does: the channels an application uses, its
operations, each message's payload schema as the models have it, and the AMQP bindings with the
status queue's exact arguments."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from shared.broker.asyncapi import asyncapi, asyncapi_document
from shared.broker.private import (
    STATUS_QUEUE,
    STATUS_QUEUE_EXPIRES_MS,
    STATUS_QUEUES_PER_APP,
    TOLERATED,
)
from shared.domain.messages import OrderStatusUpdate, SubmitOrder, decode
from shared.errors import UnsupportedSchemaVersion
from tests.support.factories import order_data

COMMITTED = Path(__file__).parents[2] / "docs" / "reference" / "asyncapi.json"


def test_the_committed_document_is_the_code_s() -> None:
    assert COMMITTED.read_text() == asyncapi_document(), (
        "docs/reference/asyncapi.json is stale: run `orderflow deploy write`"
    )


def _resolve(document: dict[str, Any], ref: str) -> Any:
    assert ref.startswith("#/"), ref
    node: Any = document
    for part in ref[2:].split("/"):
        node = node[part]
    if isinstance(node, dict) and set(node) == {"$ref"}:  # a reference to a reference
        return _resolve(document, node["$ref"])
    return node


def _refs(node: Any) -> list[str]:
    if isinstance(node, dict):
        own = [node["$ref"]] if isinstance(node.get("$ref"), str) else []
        return own + [r for value in node.values() for r in _refs(value)]
    if isinstance(node, list):
        return [r for value in node for r in _refs(value)]
    return []


def test_every_reference_resolves() -> None:
    document = asyncapi()
    refs = _refs(document)
    assert len(refs) > 10
    for ref in refs:
        _resolve(document, ref)


def test_the_operations_send_orders_and_receive_statuses_on_their_channels() -> None:
    document = asyncapi()
    assert document["asyncapi"] == "3.0.0"
    operations = document["operations"]
    assert {name: op["action"] for name, op in operations.items()} == {
        "submitOrder": "send",
        "receiveStatus": "receive",
    }
    submit = _resolve(document, operations["submitOrder"]["channel"]["$ref"])
    status = _resolve(document, operations["receiveStatus"]["channel"]["$ref"])
    assert submit["address"] == "{hub}.submit"
    assert status["address"] == "{hub}.status.{user}.{tag}"
    assert operations["submitOrder"]["reply"]["address"]["location"] == (
        "$message.payload#/reply_to"
    )
    for operation in operations.values():
        channel = _resolve(document, operation["channel"]["$ref"])
        for message in operation["messages"]:
            assert _resolve(document, message["$ref"]) in [
                _resolve(document, m["$ref"]) for m in channel["messages"].values()
            ]
        assert set(_parameters(channel["address"])) == set(channel["parameters"])


def _parameters(address: str) -> list[str]:
    return [part.split("}")[0] for part in address.split("{")[1:]]


def test_the_bindings_name_the_exchange_and_the_status_queue_s_exact_declaration() -> None:
    channels = asyncapi()["channels"]
    exchange = channels["submit"]["bindings"]["amqp"]
    assert exchange["is"] == "routingKey"
    assert exchange["exchange"] == {
        "name": "{hub}.submit",
        "type": "fanout",
        "durable": True,
        "autoDelete": False,
    }
    queue = channels["status"]["bindings"]["amqp"]
    assert queue["is"] == "queue"
    assert queue["queue"] == {
        "name": "{hub}.status.{user}.{tag}",
        "durable": True,
        "exclusive": False,
        "autoDelete": False,
    }
    assert queue["x-arguments"] == STATUS_QUEUE == {"x-expires": STATUS_QUEUE_EXPIRES_MS}


@pytest.mark.parametrize(
    ("message", "model", "type_"),
    [
        ("orderSubmit", SubmitOrder, "order.submit"),
        ("orderStatus", OrderStatusUpdate, "order.status"),
    ],
)
def test_each_message_s_payload_is_its_model_s_schema(
    message: str, model: type, type_: str
) -> None:
    document = asyncapi()
    described = document["components"]["messages"][message]
    assert described["name"] == type_ == described["bindings"]["amqp"]["messageType"]
    assert described["contentType"] == "application/json"
    schema = _resolve(document, described["payload"]["$ref"])
    assert set(schema["properties"]) == set(model.model_fields)
    assert schema["additionalProperties"] is False
    assert "schema_version" in schema["required"]
    for field, info in model.model_fields.items():
        if info.is_required():
            assert field in schema["required"], field


def test_schema_version_is_required_because_the_decoder_requires_it() -> None:
    body = SubmitOrder(order=order_data("o-1")).model_dump(mode="json")
    del body["schema_version"]
    with pytest.raises(UnsupportedSchemaVersion):
        decode("order.submit", json.dumps(body).encode(), max_bytes=65536)


PAGE = COMMITTED.with_name("application-contract.md")


def test_the_contract_page_s_examples_decode_and_its_figures_are_the_code_s() -> None:
    page = PAGE.read_text()
    submit, status = re.findall(r"```json\n(.*?)```", page, re.S)
    assert isinstance(decode("order.submit", submit.encode(), max_bytes=65536), SubmitOrder)
    assert isinstance(decode("order.status", status.encode(), max_bytes=65536), OrderStatusUpdate)
    assert f'`{{"x-expires": {STATUS_QUEUE_EXPIRES_MS}}}`' in page
    assert f"at most {STATUS_QUEUES_PER_APP} status queues" in page
    tolerated = re.search(r"differs only in\s+(.*?)\s+\(submission logs", page, re.S)
    assert tolerated is not None
    assert set(re.findall(r"`([a-z_-]+)`", tolerated[1])) == TOLERATED
