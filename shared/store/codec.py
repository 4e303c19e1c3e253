"""Turning domain values into what a store keeps, and back."""

from __future__ import annotations

from datetime import UTC, datetime
from enum import Enum
from typing import Any

from pydantic import BaseModel

from shared.domain.models import STORED, StateRecord


def plain(value: Any) -> Any:
    """Models to dicts and enums to their values, keeping datetimes native (BSON, asyncpg)."""
    if isinstance(value, BaseModel):
        return plain(value.model_dump(mode="python"))
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    if isinstance(value, datetime) and value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    return value


def jsonable(value: Any) -> Any:
    """Like `plain`, but with datetimes as ISO strings (for JSON columns)."""
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, datetime):
        return value.isoformat()
    return plain(value)


def aware(value: datetime | None) -> datetime | None:
    """Stores may hand back naive UTC datetimes; the domain only ever uses aware ones."""
    if value is not None and value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    return value


def state_from(doc: dict[str, Any]) -> StateRecord:
    return StateRecord.model_validate(doc, strict=False, context=STORED)
