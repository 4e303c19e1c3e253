"""The fuzzer's kept inputs, replayed on every run without atheris (tests/fuzz/fuzz_decode.py).

Every file in tests/fuzz/regressions/ is one fuzzer input (its first byte chooses the message
type, `tests.fuzz.decode_check.split`): representative messages, and each finding, minimised.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from shared.domain.messages import CONTRACTS
from tests.fuzz.decode_check import TYPES, check, join, split
from tests.fuzz.seeds import REGRESSIONS, seed_messages

KEPT = sorted(path for path in REGRESSIONS.iterdir() if path.is_file())
DICTIONARY = Path(__file__).parents[1] / "fuzz" / "json.dict"


def test_inputs_are_kept() -> None:
    assert len(KEPT) >= 5


@pytest.mark.parametrize("path", KEPT, ids=lambda p: p.name)
def test_kept_input(path: Path) -> None:
    check(path.read_bytes())


def test_every_seed_passes() -> None:
    for type_name, body in seed_messages():
        check(join(type_name, body))


@pytest.mark.parametrize("type_name", [*TYPES, None, "", "no.such\x00type", "\udcff", "x" * 300])
def test_split_reads_what_join_wrote(type_name: str | None) -> None:
    body = b'{"schema_version": 1}'
    assert split(join(type_name, body)) == (type_name and type_name[:255], body)


def _keys(model: type) -> set[str]:
    found: set[str] = set()
    for name, field in model.model_fields.items():  # type: ignore[attr-defined]
        found.add(name)
        for inner in _annotations(field.annotation):
            if hasattr(inner, "model_fields"):
                found |= _keys(inner)
    return found


def _annotations(annotation: object) -> list[object]:
    from typing import get_args

    return [annotation, *(a for arg in get_args(annotation) for a in _annotations(arg))]


def test_the_dictionary_names_every_key_of_every_contract() -> None:
    entries = set(re.findall(r'^"\\"(\w+)\\":"$', DICTIONARY.read_text(), re.MULTILINE))
    keys = set().union(*(_keys(contract) for contract in CONTRACTS.values()))
    assert keys - entries == set(), "add them to tests/fuzz/json.dict"
