"""When a serving-time maintenance is due, and whether it reclaims: decided from what the pause
logger already measures, with no heap walk while serving.

**The trigger.** The pause logger times every collection; its ``on_collection`` sink is
:meth:`MaintenanceTrigger.on_collection`. A full (generation 2) collection while ``serving``
whose pause reaches :data:`DUE_FRACTION` of the pause budget marks maintenance due. Why half:
after a freeze, CPython runs a full collection when the objects promoted since the last one
exceed 25% of the long-lived objects it left unfrozen, so while the heap grows each full pass
walks about 1.25 times the last. A pass at half the budget is followed by passes at ~0.63,
~0.78 and ~0.98 of it: three more full passes, each a quarter more heap later, before one
would exceed the budget. That is the margin in which the maintainer must find a quiescent
moment (an idle moment, a withdrawal), and the margin for a pass that is slower than the
growth alone predicts (a busy machine, a callback of another library).

**The estimate of the unfrozen heap**, for the ``dynamo_gc_unfrozen_objects_estimate`` gauge
and the reclaim policy: on CPython 3.15 the collector reports the objects a collection examined
(``info["candidates"]``), which for a full collection is the unfrozen heap; before 3.15, the
last serving full pause times a rate in objects per second, calibrated from a collection whose
size is known: the start-up freeze's (collected + frozen over its collection's time), then each
counted maintenance's.

The callback runs inside the collector, in whichever thread triggered it: it sets plain
attributes and nothing else (no lock, no log, no allocation worth the name). The maintainer
polls them from its event loop.

**Reclaiming** (:class:`ReclaimPolicy`): whether a maintenance also unfreezes and walks the
whole heap to collect the garbage the permanent generation has pinned. In ``withdraw`` every
maintenance does (no client can wait on it: the peers take the traffic). In ``idle`` a request
that arrives meanwhile waits for it, so: when the whole-heap walk is estimated to fit in the
pause budget, or every :data:`IDLE_RECLAIM_EVERY` maintenances once the process has been idle
for :data:`IDLE_RECLAIM_QUIET_S` (a quiet process is likely to stay quiet for the walk).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from dynamo_gc import lifecycle
from dynamo_gc.freeze import FreezeRecord

# A serving full collection whose pause reaches this share of the budget makes maintenance due.
DUE_FRACTION = 0.5
# Idle: reclaim at least every this many maintenances, when idle for this long.
IDLE_RECLAIM_EVERY = 8
IDLE_RECLAIM_QUIET_S = 1.0

FULL = 2  # the generation of a full collection


class MaintenanceTrigger:
    """Marks maintenance due from the serving full collections' pauses (module docstring)."""

    def __init__(
        self,
        budget_ms: float,
        *,
        due_fraction: float = DUE_FRACTION,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.budget_s = budget_ms / 1000.0
        self.due_at_s = self.budget_s * due_fraction
        self._clock = clock
        self.due = False
        self.due_since: float | None = None  # clock() when it became due
        self.due_pause_s: float | None = None  # the pause that made it due
        self.serving_full_collections = 0
        self.last_full_pause_s: float | None = None  # the last serving full collection's
        self.last_full_candidates: int | None = None  # its examined objects (3.15+)
        self.maintaining_candidates: int | None = None  # the last maintenance collection's
        self.objects_per_s: float | None = None  # calibrated walk rate

    # -- inside the collector (any thread): plain attributes only ------------------------------

    def on_collection(self, generation: int, seconds: float, info: dict) -> None:
        if generation != FULL:
            return
        phase = lifecycle.current_phase()
        candidates = info.get("candidates")
        counted = candidates if isinstance(candidates, int) and candidates > 0 else None
        if phase is lifecycle.Phase.MAINTAINING:
            self.maintaining_candidates = counted
            return
        if phase is not lifecycle.Phase.SERVING:
            return
        self.serving_full_collections += 1
        self.last_full_pause_s = seconds
        self.last_full_candidates = counted
        if seconds >= self.due_at_s and not self.due:
            self.due_pause_s = seconds
            self.due_since = self._clock()
            self.due = True

    # -- on the maintainer's loop ------------------------------------------------------------

    def due_for_s(self) -> float:
        """How long maintenance has been due (0 when it is not)."""
        if not self.due or self.due_since is None:
            return 0.0
        return max(0.0, self._clock() - self.due_since)

    def calibrate(self, objects: int | None, seconds: float | None) -> None:
        """A collection that examined ``objects`` took ``seconds``: the rate of the estimate."""
        if objects and seconds and objects > 0 and seconds > 0:
            self.objects_per_s = objects / seconds

    def calibrate_from_freeze(self, record: FreezeRecord | None) -> None:
        """The start-up freeze's collection examined what it collected and what it froze."""
        if record is not None and record.collect_ms:
            self.calibrate(record.collected + record.frozen, record.collect_ms / 1000.0)

    def unfrozen_estimate(self) -> int | None:
        """Objects outside the permanent generation, as the last serving full collection saw
        them (None: no estimate yet)."""
        if self.last_full_candidates is not None:
            return self.last_full_candidates
        if self.last_full_pause_s is None or self.objects_per_s is None:
            return None
        return round(self.last_full_pause_s * self.objects_per_s)

    def walk_estimate_s(self, objects: int | None) -> float | None:
        """How long a full walk of ``objects`` takes at the calibrated rate (None: unknown)."""
        if objects is None or self.objects_per_s is None:
            return None
        return objects / self.objects_per_s

    def maintained(self) -> None:
        """A maintenance ran: nothing is due, and the unfrozen heap starts from (about) zero."""
        self.due = False
        self.due_since = None
        self.due_pause_s = None
        self.last_full_pause_s = 0.0
        self.last_full_candidates = None


class ReclaimPolicy:
    """Whether the next maintenance also reclaims what the permanent generation pinned."""

    def __init__(self, *, always: bool, budget_s: float) -> None:
        self.always = always
        self.budget_s = budget_s
        self.since_reclaim = 0  # maintenances since the last reclaim

    def decide(self, whole_walk_s: float | None, idle_for_s: float) -> bool:
        if self.always:
            return True
        if whole_walk_s is not None and whole_walk_s <= self.budget_s:
            return True
        return self.since_reclaim + 1 >= IDLE_RECLAIM_EVERY and idle_for_s >= IDLE_RECLAIM_QUIET_S

    def done(self, reclaimed: bool) -> None:
        self.since_reclaim = 0 if reclaimed else self.since_reclaim + 1
