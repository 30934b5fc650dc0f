"""The garbage collector as every service process runs it, once it has started.

- **The start-up heap is frozen.** A service builds most of its long-lived objects while it
  starts (modules, the catalog, policies, schemas, clients: about 100,000 objects).
  CPython's full collection (generation 2) walks every object the collector tracks, with the
  event loop stopped, and it comes when enough objects have survived the younger passes. In
  the flood test, the executor's took 121 ms, and another tenant's read that had just
  arrived waited behind it (docs/measurements.md, "Garbage collection, measured").
  ``gc.freeze()`` moves what exists into a permanent generation that no pass walks, so a full
  pass walks only what was allocated since. Garbage is collected first, so nothing
  unreachable is frozen; a frozen object still goes when its last reference does (only a
  cycle among them would stay).
- **A young generation of 50,000 objects** (Python's default: 700). A batch in flight holds
  thousands of young objects that die with it; with 700, each pass scans them and promotes
  the survivors, which a later, larger pass scans again. With 10,000 (what `stages` had), a
  batch of 2,333 refusals still met 2 to 5 ms passes over 11,000 to 20,000 objects, about 30
  per flood; with 50,000 its objects die before a pass comes.

``ratifier stages`` did both alone since the admission work; every service does now."""

from __future__ import annotations

import gc
import logging

log = logging.getLogger("ratifier.runtime")

# The collector's young generation in every service (Python's default: 700).
YOUNG_OBJECTS = 50_000


def settle_heap(service: str) -> int:
    """Collect, freeze every object the collector tracks now, and set the young generation;
    how many objects are frozen. Called once a service has started; calling it again freezes
    what was built since (what was frozen stays so)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(YOUNG_OBJECTS, *gc.get_threshold()[1:])
    frozen = gc.get_freeze_count()
    log.info("%s: %d objects left out of garbage collection passes", service, frozen)
    return frozen
