"""The serving-time maintenance operation: collect and freeze again inside a maintenance window.

The start-up freeze takes the start-up heap out of every later collection, but everything made
after it (per-model state, caches, leaks) stays in the collected generations, so full
collections grow with uptime. A maintenance, run only where the process admits nothing and has
nothing in flight (the ``maintaining`` phase of :mod:`dynamo_gc.lifecycle`), starts the
unfrozen heap small again:

* ``gc.collect()`` then ``gc.freeze()``: the garbage among the objects made since the last
  freeze is collected, the rest moves into the permanent generation (a walk of that unfrozen
  heap only);
* with ``reclaim``, also ``gc.unfreeze()`` and a second ``gc.collect()`` before the freeze: the
  whole heap is walked once, and the garbage the permanent generation had pinned (frozen
  objects that later became cyclic garbage, which no collection sees while they are frozen) is
  collected. That count is reported apart (``reclaimed``) from the young garbage
  (``collected``).

Both end with :func:`settle_after_freeze`: one more full collection, of what was made since
the freeze (nothing, inside the window), so that CPython's 25% rule counts from the unfrozen
heap again. ``gc.freeze()`` does not reset the long-lived total the rule compares promotions
with: without this pass, the next full collection would wait for a quarter of everything just
frozen to be promoted again, and walk all of that in one pause (measured on 3.11: the first
full pass after freezing 750k objects walked 15 ms of heap, 1.7 ms with the settling pass).

The guard: :func:`maintain_gc_heap` runs only with the current, open
:class:`~dynamo_gc.lifecycle.MaintenanceWindow`, and only when the window's in-flight count is
0 at the moment it would collect; anything else is refused with a WARNING and touches no GC
state. ``gc.get_freeze_count()`` (a walk of the permanent generation) runs only when asked
(``count_frozen``), inside the window.
"""

from __future__ import annotations

import gc
import logging
import time
from dataclasses import dataclass

from dynamo_gc import lifecycle
from dynamo_gc.freeze import FreezeRecord, tell_freeze_observers

logger = logging.getLogger(__name__)

REFUSED_LINE = "GC heap freeze refused (%s): process is serving requests"
IN_FLIGHT_LINE = "GC heap freeze refused (%s): %d request(s) in flight"


@dataclass(frozen=True)
class MaintenanceRecord:
    """What one maintenance did to the heap."""

    context: str
    reclaim: bool
    collected: int  # garbage among the objects made since the last freeze
    reclaimed: int  # garbage the permanent generation had pinned (0 unless ``reclaim``)
    frozen: int | None  # objects in the permanent generation after it (None: not counted)
    took_ms: float  # the whole operation, the count included
    collect_ms: float  # the collection of the unfrozen heap
    reclaim_ms: float | None  # the collection of the whole heap after the unfreeze


def maintain_gc_heap(
    window: object, *, context: str, reclaim: bool = False, count_frozen: bool = False
) -> MaintenanceRecord | None:
    """Collect and freeze again (see the module docstring); ``None`` when refused.

    Refused, with a WARNING and no GC state touched, unless ``window`` is the current, open
    maintenance window and nothing is in flight by its count. ``count_frozen``: walk the
    permanent generation once after the freeze (``gc.get_freeze_count()``) for an exact
    ``frozen``, which also updates the freeze metrics.
    """
    if not lifecycle.window_is_current(window):
        logger.warning(REFUSED_LINE, context)
        return None
    assert isinstance(window, lifecycle.MaintenanceWindow)
    in_flight = window.in_flight()
    if in_flight:
        logger.warning(IN_FLIGHT_LINE, context, in_flight)
        return None
    started = time.perf_counter()
    collected = gc.collect()  # the unfrozen heap: made since the last freeze
    collect_ms = (time.perf_counter() - started) * 1000.0
    reclaimed, reclaim_ms = 0, None
    try:
        if reclaim:
            gc.unfreeze()  # a splice: the permanent generation joins the oldest one
            began = time.perf_counter()
            reclaimed = gc.collect()  # the whole heap: what the freeze had pinned
            reclaim_ms = (time.perf_counter() - began) * 1000.0
    finally:
        # Whatever the collection raised (a MemoryError), the heap is frozen again: an unfrozen
        # heap would be walked whole by the next serving full collection.
        gc.freeze()
    settle_after_freeze()
    frozen = gc.get_freeze_count() if count_frozen else None
    took_ms = (time.perf_counter() - started) * 1000.0
    record = MaintenanceRecord(
        context, reclaim, collected, reclaimed, frozen, took_ms, collect_ms, reclaim_ms
    )
    if frozen is not None:
        tell_freeze_observers(FreezeRecord(context, collected + reclaimed, frozen, took_ms))
    return record


def settle_after_freeze() -> int:
    """One full collection right after a freeze: it walks only the objects made since (none, or
    nearly), and makes CPython's next full collection wait for a quarter of the unfrozen heap,
    not of the heap just frozen. Call only where a freeze may run (it is one more collection
    of the young generations, ~0.01 ms after a freeze)."""
    return gc.collect()
