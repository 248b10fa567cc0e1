"""While serving-time maintenance runs, the full collections are the maintainer's to run.

The trigger alone (:mod:`dynamo_gc.maintenance_trigger`) predicts CPython's next full collection
and asks for a maintenance ahead of it, but a prediction can be late: a machine that slows the
walk, a peer's turn at the maintenance lock, a burst of growth. Each time it is, CPython runs
that full collection in the middle of serving, and every request in flight waits for the walk
(the soak, docs/benchmarks.md section 9: 15 such pauses of 50-342 ms per 200 s in ``withdraw``,
16 of up to 220 ms in ``idle``, with the prediction alone).

So while the maintainer serves, CPython's *automatic* full collections are held off: the third
threshold is raised to :data:`GEN2_NEVER` (``gc.set_threshold`` takes C ints; gen2 would need
2**31 generation-1 collections), the first two are left as they were, so young collections and
reference counting go on as usual. The grown heap then waits, unwalked, for the next
maintenance, which the trigger makes due when its walk (estimated from CPython's counters, no
heap walk) reaches the due level, and which runs only at a quiescent moment. A full collection
somebody asks for (``gc.collect()`` in a library) still runs, and the pause logger still times it.

What this costs: cyclic garbage in the unfrozen heap is collected at the next maintenance
instead of at CPython's next full collection, which is about the same time while maintenances
keep up. When they do not (no quiescent moment for a minute, the maintainer's
``DUE_WARNING_S``, or the maintainer failed), the hold is given back and CPython's own full
collections resume, so memory is never left to the maintainer alone; the next maintenance
takes the hold again.

Where raising the third threshold does not stop automatic full collections (free-threaded
builds, CPython 3.14.0-3.14.4's incremental collector: :func:`threshold2_ignored_reason`), there
is no hold, and maintenance relies on the prediction alone.

Giving back restores the saved thresholds exactly (never a hard-coded 700: 3.13 uses 2000), but
only if they are still the held ones: if something else set the thresholds meanwhile (an
operator's code, a library), that setting is kept and the hold says so once. Only the held
third threshold is never kept: a library that changed the first two by reading the thresholds
while held copied it along, and keeping it would leave full collections off for good.
"""

from __future__ import annotations

import gc
import logging

from dynamo_gc.gc_builds import GEN2_NEVER, threshold2_ignored_reason

logger = logging.getLogger(__name__)

CHANGED_LINE = (
    "GC maintenance (%s): the GC thresholds were changed to %s while the maintainer held "
    "automatic full collections off; keeping %s (CPython's own full collections run again "
    "as they say)"
)


class FullCollectionHold:
    """CPython's automatic full collections held off, and given back (module docstring)."""

    def __init__(self, context: str) -> None:
        self.context = context
        self.unavailable = threshold2_ignored_reason()  # why no hold here (None: it works)
        self._saved: tuple[int, int, int] | None = None

    @property
    def held(self) -> bool:
        return self._saved is not None

    def threshold(self) -> int:
        """CPython's own third threshold (the held one while held): the generation-1
        collections after which it would run a full collection."""
        if self._saved is not None:
            return self._saved[2]
        return gc.get_threshold()[2]

    def take(self) -> bool:
        """Hold CPython's automatic full collections off; ``False`` where that is not possible
        (a build that ignores the third threshold) or something else has turned automatic
        collection off (then there is nothing to hold)."""
        if self._saved is not None:
            return True
        if self.unavailable is not None or not gc.isenabled():
            return False
        first, second, third = gc.get_threshold()
        if third == GEN2_NEVER:
            return False  # somebody else holds them (a benchmark's policy): not ours to give
        self._saved = (first, second, third)
        gc.set_threshold(first, second, GEN2_NEVER)
        return True

    def give_back(self) -> None:
        """Restore the thresholds saved by :meth:`take`, if they are still the held ones."""
        saved, self._saved = self._saved, None
        if saved is None:
            return
        now = tuple(gc.get_threshold())
        if now == (saved[0], saved[1], GEN2_NEVER):
            gc.set_threshold(*saved)
            return
        if now[2] == GEN2_NEVER:
            # Their first two, with the held third copied along (``t0, t1, t2 =
            # gc.get_threshold()`` and a new t0, while held): kept as it is, that would leave
            # automatic full collections off for good, with nobody left to give them back.
            gc.set_threshold(now[0], now[1], saved[2])
        logger.warning(CHANGED_LINE, self.context, now, tuple(gc.get_threshold()))
