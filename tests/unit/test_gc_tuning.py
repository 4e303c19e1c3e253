"""A serving process moves its start-up objects out of the collector's way (services/cli/serve)."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from services.cli.serve import GC_YOUNG_THRESHOLD, tune_gc


@pytest.fixture
def restored_gc() -> Iterator[None]:
    threshold = gc.get_threshold()
    try:
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*threshold)


@pytest.mark.usefixtures("restored_gc")
def test_tuning_freezes_what_exists_and_raises_only_the_young_threshold() -> None:
    _, older, oldest = gc.get_threshold()
    tune_gc()
    assert gc.get_freeze_count() > 1000, "the objects imports left behind are frozen"
    assert gc.get_threshold() == (GC_YOUNG_THRESHOLD, older, oldest)
    # Cycles made afterwards are still found.
    cycle: list[object] = []
    cycle.append(cycle)
    del cycle
    assert gc.collect() >= 1
