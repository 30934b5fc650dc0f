"""The collector as every service runs it once started (runtime/heap.py)."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from runtime.heap import YOUNG_OBJECTS, settle_heap


@pytest.fixture
def restored_collector() -> Iterator[None]:
    threshold = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*threshold)


@pytest.mark.usefixtures("restored_collector")
def test_settled_heap_is_frozen_without_garbage_and_the_young_generation_is_larger() -> None:
    class Node:
        def __init__(self) -> None:
            self.me = self

    cycle = Node()
    garbage = weakref.ref(cycle)
    kept = Node()
    del cycle  # unreachable: collected first, never frozen
    assert any(o is kept for o in gc.get_objects())  # walked by the collector's passes
    frozen = settle_heap("test")
    assert frozen == gc.get_freeze_count() > 0
    assert garbage() is None
    assert not any(o is kept for o in gc.get_objects())  # frozen: no pass walks it
    assert gc.get_threshold()[0] == YOUNG_OBJECTS
