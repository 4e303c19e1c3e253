"""What the API's request models take: found by schemathesis against the served document (each
a regression test now). A lax reading took `"dry_run": 0` for false, and so for a real bulk
resubmission, and a number of seconds for a time."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from services.api.context import BUILT_IN_CATALOGUE, load_catalogue
from services.api.models import BulkResubmit, NewOrder, Replay, ResubmitOne
from shared.config import Settings
from shared.errors import ConfigurationError
from tests.support.factories import order_data


@pytest.mark.parametrize(
    "body",
    [
        {"dry_run": 0},
        {"dry_run": "false"},
        {"keep_failures": 1},
        {"rate": "20"},
        {"selected": [{"order_id": "o-1", "seen": 0}]},
        {"selected": [{"order_id": "o-1", "seen": "0.5"}]},
        {"selected": [{"order_id": "o-1", "seen": "2026-01-01T00:00:00"}]},  # no offset
        {"selected": [{"order_id": "", "seen": "2026-01-01T00:00:00Z"}]},
        {"error_kind": "nope"},
        {"surprise": True},
    ],
)
def test_a_bulk_resubmission_takes_no_lax_value(body: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        BulkResubmit.model_validate(body)


def test_a_bulk_resubmission_is_a_dry_run_unless_told_otherwise() -> None:
    body = BulkResubmit.model_validate(
        {
            "error_kind": "transient",
            "rate": 5,
            "selected": [{"order_id": "shop/acme.o-1", "seen": "2026-01-01T00:00:00+02:00"}],
        }
    )
    assert body.dry_run and body.rate == 5.0
    assert body.selected is not None and body.selected[0].seen.utcoffset() is not None
    assert not BulkResubmit.model_validate({"dry_run": False}).dry_run


@pytest.mark.parametrize("model", [ResubmitOne, Replay])
def test_other_bodies_refuse_unknown_fields(model: Any) -> None:
    with pytest.raises(ValidationError):
        model.model_validate({"by": "someone else"})


def test_a_shop_s_order_is_order_submit_s_with_a_shorter_id() -> None:
    order = order_data("o-1").model_dump(mode="json")
    assert NewOrder.model_validate(order).order_id == "o-1"
    for bad in ("x" * 41, "a/b", "", "-x"):
        with pytest.raises(ValidationError):
            NewOrder.model_validate(order | {"order_id": bad})


def test_the_catalogue_comes_from_its_file_or_is_built_in(tmp_path: Path) -> None:
    assert [i.sku for i in load_catalogue(Settings().api).items] == [
        i.sku for i in BUILT_IN_CATALOGUE
    ]
    path = tmp_path / "catalogue.json"
    path.write_text(json.dumps([{"sku": "cake-1", "name": "Lemon cake", "unit_price_cents": 450}]))
    catalogue = load_catalogue(Settings(api_catalogue_path=str(path)).api)
    assert [(i.sku, i.name, i.unit_price_cents) for i in catalogue.items] == [
        ("cake-1", "Lemon cake", 450)
    ]
    assert set(catalogue.test_payment_tokens) == {"tok_visa", "tok_declined"}
    for bad in ("not json", json.dumps([{"sku": "a b", "name": "x", "unit_price_cents": 1}])):
        path.write_text(bad)
        with pytest.raises(ConfigurationError, match="ORDERFLOW_API_CATALOGUE_PATH"):
            load_catalogue(Settings(api_catalogue_path=str(path)).api)
    with pytest.raises(ConfigurationError, match="ORDERFLOW_API_CATALOGUE_PATH"):
        load_catalogue(Settings(api_catalogue_path=str(tmp_path / "missing.json")).api)
