"""Records of the processes coordinating: the supervisor leader lease, the heartbeats of running
processes, and what the inbox answers a consumer about a message id."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

SUPERVISOR_LEASE = "supervisor"
"""The name of the lease the supervisor leader holds (the schedulers and `stats` read it)."""


class _Record(BaseModel):
    model_config = ConfigDict(strict=True, frozen=True, extra="forbid")


class Lease(_Record):
    name: str
    holder: str
    expires_at: datetime
    acquired_at: datetime


class ComponentStatus(_Record):
    """A running process's heartbeat: what it is and how it is doing (for `stats` and `watch`).
    It expires when the process stops reporting; a clean stop removes it."""

    name: Annotated[str, StringConstraints(min_length=1, max_length=128)]
    kind: Annotated[str, StringConstraints(min_length=1, max_length=64)]
    at: datetime
    expires_at: datetime
    data: dict[str, Any] = Field(default_factory=dict)
    """Kind-specific: e.g. `open_breakers` of an agent, `inflight` of a scheduler, `leader`."""


class InboxOutcome(StrEnum):
    """What the inbox says about a message id a consumer is about to handle."""

    CLAIMED = "claimed"
    """New (or abandoned by a dead consumer): handle it."""
    DUPLICATE = "duplicate"
    """Already handled within the dedupe window: acknowledge and drop."""
    BUSY = "busy"
    """Another live consumer is handling it right now: try again after its claim expires."""
