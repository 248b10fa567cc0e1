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

**Ahead of the next full collection.** Waiting for a pause alone is not enough once the heap
grows fast: after a maintenance (and its settling pass) CPython runs its next full collection as
soon as its young collections have seen threshold0 x threshold1 x threshold2 net allocations
(70k objects on 3.10-3.12, 200k on 3.13+; the 25% rule only delays it while the unfrozen heap is
large), and each full collection walks everything grown since the last maintenance: the first
walks one such cycle's growth, the second two, and so on. So the trigger also learns how long
one cycle's growth takes to walk (:attr:`MaintenanceTrigger.cycle_walk_s`: each serving full
collection's pause over the cycles since the last maintenance, and each maintenance's own
collection likewise), and when the next full collection would reach the due level (the last
one's pause plus one more cycle) it marks maintenance due ahead of it (reason ``ahead``): once
CPython's own count of generation-1 collections since the last full one (``gc.get_count()[2]``,
a counter: no walk) is near enough the earliest full collection: within :data:`AHEAD_MARGIN` of
it, or within the time the maintainer took to reach its last quiescent moments (a withdrawal
waits for requests to finish, the frontends to see it, a peer's maintenance), twice over, at the
pace the count has been rising (:meth:`MaintenanceTrigger.look_ahead`). A workload
whose single cycle already walks past the due level is then maintained every cycle, before its
full collection can run; one that grows slowly, every few cycles; the full collections that do
run stay under the due level.

**Only after growth.** An ``ahead`` maintenance is due only once at least
:data:`AHEAD_MIN_GROWTH` of a cycle has grown since the last maintenance (the serving full
collections since it, plus CPython's generation-1 count over threshold + 1: counters, no walk);
a ``pause`` still makes it due at once. Why: the lead is in generation-1 collections, and when
reaching quiescence takes long against the young collections' pace (a withdrawal, on a busy
machine) it grows past a whole cycle (threshold + 1 of them), so without this bound a
maintenance was due again the moment one ended, before anything had grown: the soak's
``withdraw`` arm ran hundreds of maintenances that collected nothing (a storm) and kept one worker
out of routing most of the run. Half a cycle, because a maintenance that ran earlier than that
would collect less than half of what the next full collection walks anyway, while a bound of a
whole cycle would let that full collection run before any ``ahead`` maintenance could: at half,
each maintenance has at least half a cycle's growth to collect, and the lead keeps the other
half (a workload that needs more lead than that meets the next full collection, one cycle's walk
at most since the maintenance, which a ``pause`` then answers).

**With full collections held off** (:mod:`dynamo_gc.full_collection_hold`, the maintainer's
while it serves), no full collection runs to time or to get ahead of: :meth:`look_held` makes a
maintenance due (``ahead``) once the walk of what has grown since the last one, estimated from
the same counter and the measured walk of one cycle (:meth:`held_walk_s`), reaches the due
level. The lead and the half-cycle bound above are for the unheld case only.

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
whole heap to collect the garbage the permanent generation has pinned. In ``withdraw`` no client
waits on it (the peers take the traffic), but the worker is out of routing for the walk: it
reclaims at the first maintenance, and then once the time since the last reclaim is at least
the estimated whole-heap walk over :data:`WITHDRAW_RECLAIM_SHARE`, so reclaims keep a worker out
of routing for at most that share of its time, and the garbage pinned between two reclaims is
what the workload evicts in that time. In ``idle`` a request that arrives meanwhile waits for
it, so: when the whole-heap walk is estimated to fit in the pause budget, or every
:data:`IDLE_RECLAIM_EVERY` maintenances once the process has been idle for
:data:`IDLE_RECLAIM_QUIET_S` (a quiet process is likely to stay quiet for the walk). A process
under continuous load never idles that long, and whatever its workload evicts of the frozen
heap would stay pinned for good (the soak's idle worker ended at 1.44x the stock one's RSS):
after :data:`IDLE_RECLAIM_OVERDUE` maintenances without a reclaim, one runs at the next
ordinary idle moment as long as the whole walk is estimated within
:data:`IDLE_RECLAIM_OVERDUE_BUDGETS` budgets, a wait a request sees at most once per that many
maintenances. A heap too large for that is left pinned, and the maintainer says so once (use
``withdraw``).
"""

from __future__ import annotations

import gc
import math
import time
from collections.abc import Callable

from dynamo_gc import lifecycle
from dynamo_gc.freeze import FreezeRecord

# A serving full collection whose pause reaches this share of the budget makes maintenance due.
DUE_FRACTION = 0.5
# Ahead: due when the earliest next full collection is this many generation-1 collections away
# (each is threshold0 x threshold1 net allocations: 7k objects on 3.10-3.12, 20k on 3.13+).
AHEAD_MARGIN = 4
# Ahead: due only once this share of a cycle (threshold + 1 generation-1 collections) has grown
# since the last maintenance (the module docstring: no storm of maintenances that collect nothing).
AHEAD_MIN_GROWTH = 0.5
# How much a new sample moves an estimate (an exponential average): one cycle's walk, the time
# between two generation-1 collections.
CYCLE_WEIGHT = 0.5
# Ahead: the lead asked for, in multiples of the time the last quiescent moments took to reach.
AHEAD_LEAD = 2.0
# That time is the longest one recently: each maintenance keeps this share of the last longest
# (a withdrawal that waited for a peer's long reclaim once will likely wait again).
REACH_DECAY = 0.8
# withdraw: reclaims take at most this share of a worker's time out of routing.
WITHDRAW_RECLAIM_SHARE = 0.1
# Idle: reclaim at least every this many maintenances, when idle for this long.
IDLE_RECLAIM_EVERY = 8
IDLE_RECLAIM_QUIET_S = 1.0
# Idle under continuous load: after this many maintenances without one, reclaim at an ordinary
# idle moment if the whole walk is estimated within this many pause budgets.
IDLE_RECLAIM_OVERDUE = 32
IDLE_RECLAIM_OVERDUE_BUDGETS = 20.0

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
        self.due_reason = "pause"  # "pause": a pause reached the due level; "ahead": predicted
        self.due_since: float | None = None  # clock() when it became due
        self.due_pause_s: float | None = None  # the pause that made it due
        self.cycle_walk_s: float | None = None  # the walk of one cycle's growth (estimated)
        self.pass_interval_s: float | None = None  # between two generation-1 collections
        self.reach_s: float | None = None  # from due to a quiescent moment (recent longest)
        self._passes_seen = 0
        self._passes_at: float | None = None
        self.full_since_maintained = 0  # serving full collections since the last maintenance
        self.serving_full_collections = 0
        self.last_full_pause_s: float | None = None  # the last serving full collection's
        self.last_full_candidates: int | None = None  # its examined objects (3.15+)
        self.maintaining_candidates: int | None = None  # the window's largest collection's
        self.objects_per_s: float | None = None  # calibrated walk rate
        # With full collections held off: the unfrozen heap's walk now, as last estimated.
        self.predicted_walk_s: float | None = None

    # -- inside the collector (any thread): plain attributes only ------------------------------

    def on_collection(self, generation: int, seconds: float, info: dict) -> None:
        if generation != FULL:
            return
        phase = lifecycle.current_phase()
        candidates = info.get("candidates")
        counted = candidates if isinstance(candidates, int) and candidates > 0 else None
        if phase is lifecycle.Phase.MAINTAINING:
            # The window's largest: its collect (the unfrozen heap) or its reclaim (the whole
            # heap), the walk the maintainer times; never the settling pass after the freeze,
            # which examines nothing (0: it erased the count on 3.15) or a handful (a rate from
            # those over the collect's time would be thousands of times too slow).
            known = self.maintaining_candidates
            if counted is not None and (known is None or counted > known):
                self.maintaining_candidates = counted
            return
        if phase is not lifecycle.Phase.SERVING:
            return
        self.serving_full_collections += 1
        self.full_since_maintained += 1
        self.last_full_pause_s = seconds
        self.last_full_candidates = counted
        self._learn_cycle(seconds / self.full_since_maintained)
        if seconds >= self.due_at_s and not self.due:
            self.due_pause_s = seconds
            self.due_reason = "pause"
            self.due_since = self._clock()
            self.due = True

    def _learn_cycle(self, sample_s: float) -> None:
        self.cycle_walk_s = _averaged(self.cycle_walk_s, sample_s)

    # -- on the maintainer's loop ------------------------------------------------------------

    def next_full_s(self) -> float | None:
        """The next full collection's walk as predicted: the last one's, one cycle more (None:
        no cycle measured yet)."""
        if self.cycle_walk_s is None:
            return None
        return (self.last_full_pause_s or 0.0) + self.cycle_walk_s

    def look_ahead(self, young_passes: int, threshold: int) -> None:
        """Not due, and the next full collection predicted at the due level or past it: due
        (``ahead``) once the generation-1 collections since the last full one
        (``young_passes``, CPython's ``gc.get_count()[2]``) are near the earliest next full
        collection (after ``threshold`` + 1 of them): within :data:`AHEAD_MARGIN`, or within
        :data:`AHEAD_LEAD` times the time to reach quiescence at their recent pace."""
        self.predicted_walk_s = None  # CPython's full collections run: they measure the heap
        now = self._clock()
        if young_passes > self._passes_seen and self._passes_at is not None:
            interval = (now - self._passes_at) / (young_passes - self._passes_seen)
            self.pass_interval_s = _averaged(self.pass_interval_s, interval)
        if young_passes != self._passes_seen or self._passes_at is None:
            # Risen, or back to 0 after a full collection (or the first look).
            self._passes_seen, self._passes_at = young_passes, now
        if self.due or self.cycles_since_maintained(young_passes, threshold) < AHEAD_MIN_GROWTH:
            return
        lead = AHEAD_MARGIN
        if self.pass_interval_s and self.reach_s is not None:
            lead = max(lead, math.ceil(AHEAD_LEAD * self.reach_s / self.pass_interval_s))
        if threshold + 1 - young_passes > lead:
            return
        predicted = self.next_full_s()
        if predicted is not None and predicted >= self.due_at_s:
            self.due_reason = "ahead"
            self.due_pause_s = None
            self.due_since = self._clock()
            self.due = True

    def look_held(self, young_passes: int, threshold: int) -> None:
        """While CPython's automatic full collections are held off
        (:mod:`dynamo_gc.full_collection_hold`): due (``ahead``) once the walk the unfrozen
        heap would take now (:meth:`held_walk_s`) reaches the due level. No lead is needed: no
        full collection runs before the maintenance, so the walk only grows while the
        maintainer reaches a quiescent moment. With no estimate at all, due where CPython would
        have run its own full collection (``young_passes`` past ``threshold``)."""
        walk = self.held_walk_s(young_passes, threshold)
        self.predicted_walk_s = walk
        if self.due:
            return
        if (walk is None and young_passes > threshold) or (
            walk is not None and walk >= self.due_at_s
        ):
            self.due_reason = "ahead"
            self.due_pause_s = None
            self.due_since = self._clock()
            self.due = True

    def held_walk_s(self, young_passes: int, threshold: int) -> float | None:
        """The walk of the unfrozen heap now, with full collections held off: the last full
        collection's (0 after a maintenance) plus the share of a cycle grown since
        (``young_passes`` generation-1 collections of ``threshold`` + 1 a cycle) at one cycle's
        walk. Before any cycle is measured, one cycle is taken as every allocation it counts
        surviving, at the calibrated walk rate: an upper bound, so the first maintenance
        comes early and measures the real one. None: neither is known."""
        cycle = self.cycle_walk_s
        if cycle is None and self.objects_per_s:
            young, middle = gc.get_threshold()[:2]
            cycle = young * middle * (threshold + 1) / self.objects_per_s
        if cycle is None:
            return None
        return (self.last_full_pause_s or 0.0) + cycle * young_passes / (threshold + 1)

    def cycles_since_maintained(self, young_passes: int, threshold: int) -> float:
        """The growth since the last maintenance (or the start-up freeze), in cycles: the
        serving full collections since it, and the share of one the generation-1 collections
        since the last full one make (``young_passes`` of ``threshold`` + 1)."""
        return self.full_since_maintained + young_passes / (threshold + 1)

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
        them, or with full collections held off as the walk estimated since would find them
        (None: no estimate yet)."""
        if self.last_full_candidates is not None:
            return self.last_full_candidates
        if self.predicted_walk_s is not None and self.objects_per_s is not None:
            return round(self.predicted_walk_s * self.objects_per_s)
        if self.last_full_pause_s is None or self.objects_per_s is None:
            return None
        return round(self.last_full_pause_s * self.objects_per_s)

    def reached(self, seconds: float) -> None:
        """A quiescent moment was reached ``seconds`` after maintenance became due."""
        self.reach_s = seconds if self.reach_s is None else max(seconds, self.reach_s * REACH_DECAY)

    def walk_estimate_s(self, objects: int | None) -> float | None:
        """How long a full walk of ``objects`` takes at the calibrated rate (None: unknown)."""
        if objects is None or self.objects_per_s is None:
            return None
        return objects / self.objects_per_s

    def maintained(self, collect_s: float | None = None, cycles: float | None = None) -> None:
        """A maintenance ran: nothing is due, and the unfrozen heap starts from (about) zero.
        ``collect_s``: its collection of the unfrozen heap, which held ``cycles`` cycles'
        growth (the full collections since the last maintenance, and the share of one the
        young collections counted since): a sample of one cycle's walk."""
        if collect_s is not None and cycles:
            self._learn_cycle(collect_s / cycles)
        self.due = False
        self.due_since = None
        self.due_pause_s = None
        self.full_since_maintained = 0
        self.last_full_pause_s = 0.0
        self.last_full_candidates = None
        self.predicted_walk_s = None  # held: walked now, not what was predicted before it


def _averaged(known: float | None, sample: float) -> float:
    return sample if known is None else known + CYCLE_WEIGHT * (sample - known)


class ReclaimPolicy:
    """Whether the next maintenance also reclaims what the permanent generation pinned (see
    the module docstring): ``withdraw`` by its share of time, ``idle`` by the budget and the
    schedule."""

    def __init__(
        self, *, withdraw: bool, budget_s: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.withdraw = withdraw
        self.budget_s = budget_s
        self._clock = clock
        self.since_reclaim = 0  # maintenances since the last reclaim
        self.reclaimed_at: float | None = None  # clock() at the last reclaim (None: never)

    def decide(self, whole_walk_s: float | None, idle_for_s: float) -> bool:
        if self.withdraw:
            if self.reclaimed_at is None or whole_walk_s is None:
                return True
            return self._clock() - self.reclaimed_at >= whole_walk_s / WITHDRAW_RECLAIM_SHARE
        if whole_walk_s is not None and whole_walk_s <= self.budget_s:
            return True
        if self.since_reclaim + 1 >= IDLE_RECLAIM_EVERY and idle_for_s >= IDLE_RECLAIM_QUIET_S:
            return True
        return (
            self.overdue()
            and whole_walk_s is not None
            and (whole_walk_s <= IDLE_RECLAIM_OVERDUE_BUDGETS * self.budget_s)
        )

    def overdue(self) -> bool:
        """``idle`` only: so many maintenances without a reclaim that one runs at an ordinary
        idle moment, if the walk is not too long."""
        return not self.withdraw and self.since_reclaim + 1 >= IDLE_RECLAIM_OVERDUE

    def done(self, reclaimed: bool) -> None:
        self.since_reclaim = 0 if reclaimed else self.since_reclaim + 1
        if reclaimed:
            self.reclaimed_at = self._clock()
