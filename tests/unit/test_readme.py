"""The README's configuration table lists every setting with its real default."""

from __future__ import annotations

import re
from pathlib import Path

from shared.config import FIELDS

README = Path(__file__).resolve().parents[2] / "README.md"


def test_every_setting_is_documented_with_its_default() -> None:
    rows = dict(
        re.findall(r"^\| `ORDERFLOW_([A-Z0-9_]+)` \| .*? \| `(.*?)` \|$", README.read_text(), re.M)
    )
    fields = FIELDS
    assert set(rows) == {name.upper() for name in fields}
    for name, field in fields.items():
        assert rows[name.upper()] == str(field.default), name
