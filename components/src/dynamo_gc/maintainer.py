"""The maintainer: a task on the launcher's event loop that runs the serving-time maintenance.

It polls the trigger (:mod:`dynamo_gc.maintenance_trigger`: plain attributes the pause logger's
callback set), and when a maintenance is due it asks its :class:`Quiescence` for a quiescent
moment, runs :func:`dynamo_gc.maintenance.maintain_gc_heap` inside a maintenance window, opens
admission again, and reports: one log line, the metrics. The launcher starts it once serving
and stops it first at the drain.

While serving, it holds CPython's automatic full collections off
(:mod:`dynamo_gc.full_collection_hold`), so the heap grown since the last maintenance is walked
only by the next one, at a quiescent moment, and the trigger reads the growth from CPython's
counters (``look_held``). It gives the hold back for good when it stops, and until its next
maintenance when a step fails or a maintenance has been due for :data:`DUE_WARNING_S` (nobody
would collect that growth otherwise).

Two ways to reach quiescence, one per mode:

* :class:`IdleQuiescence` (``idle``, here): when nothing has been in flight for
  :data:`IDLE_QUIET_S`, the admission gate is held and the maintenance runs at once. Under load
  with no such moment, after :data:`LOAD_DEFER_S` of being due (:data:`AHEAD_LOAD_DEFER_S`
  when it is due ahead of the next full collection, which is then only a few young
  collections away), admission is held and the requests in flight get the pause budget to
  finish; if they do not, admission reopens (the
  attempt is counted as given up) and the next try waits twice as long as the last, from
  :data:`RETRY_FIRST_S` to :data:`RETRY_MAX_S`. It never collects with anything in flight:
  a process that never has an idle moment nor requests short enough is never maintained, says
  so (:data:`DUE_WARNING_S`) and hands its full collections back to CPython.
* ``withdraw`` (the worker's, with its discovery peers: :mod:`dynamo.vllm.withdrawal`).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from dynamo_gc import lifecycle
from dynamo_gc.admission import AdmissionGate
from dynamo_gc.freeze import last_freeze
from dynamo_gc.full_collection_hold import FullCollectionHold
from dynamo_gc.maintenance import MaintenanceRecord, maintain_gc_heap
from dynamo_gc.maintenance_metrics import MaintenanceMetrics
from dynamo_gc.maintenance_trigger import (
    IDLE_RECLAIM_EVERY,
    IDLE_RECLAIM_QUIET_S,
    MaintenanceTrigger,
    ReclaimPolicy,
)

logger = logging.getLogger(__name__)

# How often the maintainer looks at the trigger: while nothing is due, and while it is due
# (looking for an idle moment). Reading two attributes; nothing else runs.
POLL_S = 0.05
DUE_POLL_S = 0.005
# An idle moment: nothing in flight for this long.
IDLE_QUIET_S = 0.02
# Due for this long with no idle moment: hold admission and let the requests in flight finish.
LOAD_DEFER_S = 1.0
AHEAD_LOAD_DEFER_S = 0.1  # due ahead: the next full collection is a few young ones away
# After an attempt given up, the next one waits this long, doubling up to the maximum.
RETRY_FIRST_S = 1.0
RETRY_MAX_S = 16.0
# Due for this long without a maintenance: one WARNING (per due period).
DUE_WARNING_S = 60.0

MAINTAINED_LINE = (
    "GC heap maintained (%s): mode=%s reason=%s took_ms=%.1f collected=%d reclaimed=%d "
    "frozen=%s %s_ms=%.1f waiting=%d%s"
)
WAIT_LINE = "GC maintenance (%s) held %d request(s) at admission for up to %.1f ms"
GAVE_UP_LINE = (
    "GC maintenance deferred (%s): mode=%s: %d request(s) still in flight after %.0f ms; "
    "admission reopened, next try in %g s"
)
PINNED_LINE = (
    "GC maintenance (%s): %d maintenances without reclaiming the garbage the frozen generation "
    "may pin; a reclaim walks the whole heap (~%.1f s), longer than a request held at an idle "
    "maintenance should wait: it runs only in an idle second. Use withdraw where the workload "
    "evicts what it keeps"
)
DUE_LINE = (
    "GC maintenance (%s) due for %.0f s and not run: no quiescent moment found (mode %s); "
    "serving full collections keep growing meanwhile"
)
HELD_LINE = (
    "GC maintenance (%s): CPython's automatic full collections held off while serving "
    "(thresholds %s -> %s); the maintainer runs them at quiescent moments"
)
NOT_HELD_LINE = (
    "GC maintenance (%s): automatic full collections cannot be held off here (%s); "
    "maintenance runs ahead of them as predicted, and a late prediction is a serving pause"
)
GIVEN_BACK_LINE = (
    "GC maintenance (%s): CPython's automatic full collections run again (%s) until the next "
    "maintenance"
)


@dataclass
class Quiet:
    """A quiescent moment reached: admission closed, nothing in flight (by ``in_flight``)."""

    mode: str  # how it was reached: "idle" (admission held) or "withdraw" (out of routing)
    closed_at: float  # the clock when admission closed
    in_flight: Callable[[], int]
    note: str = ""  # said at the end of the maintenance's line (a withdrawal's fallback)
    handle: object = field(default=None)  # the quiescence's own state, for leave()


@dataclass
class GaveUp:
    """An attempt that closed admission and reopened it with requests still in flight."""

    mode: str
    in_flight: int
    closed_s: float  # how long admission was closed
    retry_s: float  # the wait before the next attempt
    waits: list[float]  # the requests that waited at the gate meanwhile


class Quiescence(Protocol):
    """How a mode reaches a quiescent moment, and leaves it."""

    mode: str
    gate: AdmissionGate

    async def reach(self, reason: str, due_for_s: float) -> Quiet | GaveUp | None:
        """A quiescent moment now, an attempt given up, or None (not now)."""

    async def leave(self, quiet: Quiet) -> list[float]:
        """Admit again; the waits of the requests that waited at the gate, in seconds."""


class Retry:
    """When the next attempt under load may be made, after attempts given up (doubling)."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self.not_before = 0.0
        self.next_s = RETRY_FIRST_S

    def ready(self) -> bool:
        return self._clock() >= self.not_before

    def failed(self) -> float:
        delay, self.next_s = self.next_s, min(self.next_s * 2, RETRY_MAX_S)
        self.not_before = self._clock() + delay
        return delay

    def reset(self) -> None:
        self.next_s = RETRY_FIRST_S


class IdleQuiescence:
    """``idle``: an idle moment, or under load a bounded hold (see the module docstring)."""

    mode = "idle"

    def __init__(
        self,
        gate: AdmissionGate,
        *,
        hold_bound_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.gate = gate
        self.hold_bound_s = hold_bound_s
        self._clock = clock
        self.retry = Retry(clock)

    async def reach(self, reason: str, due_for_s: float) -> Quiet | GaveUp | None:
        gate = self.gate
        quiet = IDLE_RECLAIM_QUIET_S if reason == "reclaim" else IDLE_QUIET_S
        if gate.in_flight == 0 and gate.idle_for_s() >= quiet:
            gate.hold()  # nothing awaits between here and the maintenance: the moment holds
            return Quiet(self.mode, self._clock(), gate.count)
        defer_s = AHEAD_LOAD_DEFER_S if reason == "ahead" else LOAD_DEFER_S
        if reason == "reclaim" or due_for_s < defer_s or not self.retry.ready():
            return None
        gate.hold()
        began = self._clock()
        try:
            idle = await gate.until_idle(self.hold_bound_s)
        except BaseException:  # stopped (the drain): the waiting requests go on
            gate.release()
            raise
        if idle:
            self.retry.reset()
            return Quiet(self.mode, began, gate.count, note=" (under load)")
        in_flight = gate.in_flight
        waits = gate.release()
        return GaveUp(self.mode, in_flight, self._clock() - began, self.retry.failed(), waits)

    async def leave(self, quiet: Quiet) -> list[float]:
        return self.gate.release()


def _young_passes(hold: FullCollectionHold | None) -> tuple[int, int]:
    """CPython's generation-1 collections since the last full one, and its own threshold for
    them (a full collection may run once they exceed it; while ``hold`` holds, the saved one):
    two reads of counters, no walk."""
    threshold = hold.threshold() if hold is not None else gc.get_threshold()[2]
    return gc.get_count()[2], threshold


class GcMaintainer:
    """The task that runs maintenances when due (see the module docstring)."""

    def __init__(
        self,
        trigger: MaintenanceTrigger,
        quiescence: Quiescence,
        *,
        context: str,
        pause_log_ms: float = 0.0,
        metrics: MaintenanceMetrics | None = None,
        hold: FullCollectionHold | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.trigger = trigger
        # CPython's automatic full collections, held off while serving (None: left to CPython).
        self.hold = hold
        self._hold_paused = False  # given back (overdue, failed): taken again after a maintenance
        self._hold_said: set[str] = set()  # the lines said once: "held", "not held"
        self.quiescence = quiescence
        self.context = context
        self.pause_log_ms = pause_log_ms
        self.metrics = metrics
        if metrics is not None and hold is not None:
            metrics.watch_hold(hold)
        self._clock = clock
        self.reclaim = ReclaimPolicy(
            withdraw=quiescence.mode == "withdraw", budget_s=trigger.budget_s, clock=clock
        )
        start = last_freeze()
        trigger.calibrate_from_freeze(start)
        self.frozen_estimate = start.frozen if start is not None else 0
        self.maintenances = 0
        self.last: MaintenanceRecord | None = None
        self._warned_due_at: float | None = None
        self._pinned_said = False
        self._task: asyncio.Task | None = None

    # -- the task ---------------------------------------------------------------------------

    def start(self) -> asyncio.Task:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self.run(), name=f"gc-maintainer-{self.quiescence.mode}"
            )
        return self._task

    def cancel(self) -> None:
        """Cancel the task without waiting for it (its event loop is ending anyway)."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
        self._give_back(None)  # now: the task's own ``finally`` may never run

    async def stop(self) -> None:
        """Stop (first at the drain): an attempt in progress reopens admission on its way."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def run(self) -> None:
        failing = False
        try:
            while True:
                try:
                    await self._step()
                except asyncio.CancelledError:
                    raise
                except Exception:  # a maintainer that dies silently maintains nothing
                    if not failing:
                        logger.exception("GC maintainer (%s) failed; trying again", self.context)
                    failing = True
                    # Nobody would run the held-off full collections meanwhile: CPython does.
                    self._give_back("the maintainer failed")
                    await asyncio.sleep(RETRY_MAX_S)
                else:
                    failing = False
        finally:
            self._give_back(None)  # stopped (the drain, shutdown): stock collections again

    # -- the hold on CPython's full collections --------------------------------------------

    def _hold_while_serving(self) -> bool:
        """Hold CPython's automatic full collections off while serving (unless given back
        until the next maintenance); whether they are held."""
        hold = self.hold
        if hold is None:
            return False
        if not hold.held and not self._hold_paused:
            before = gc.get_threshold()
            if hold.take():
                if "held" not in self._hold_said:
                    self._hold_said.add("held")
                    logger.info(HELD_LINE, self.context, before, gc.get_threshold())
            elif "not held" not in self._hold_said:
                self._hold_said.add("not held")
                reason = hold.unavailable or "automatic collection is off or already held"
                logger.info(NOT_HELD_LINE, self.context, reason)
        return hold.held

    def _give_back(self, why: str | None) -> None:
        """CPython's own full collections again: ``why`` given, until the next maintenance
        (said once per hold); None, for good (stopped)."""
        hold = self.hold
        if hold is None:
            return
        if why is not None:
            if hold.held:
                logger.warning(GIVEN_BACK_LINE, self.context, why)
            self._hold_paused = True
        hold.give_back()

    async def _step(self) -> None:
        reason = self._reason()
        if reason is None:
            await asyncio.sleep(POLL_S)
            return
        self._warn_if_overdue()
        due_for_s = self.trigger.due_for_s()
        quiet = await self.quiescence.reach(reason, due_for_s)
        if isinstance(quiet, GaveUp):
            self._gave_up(quiet)
        if not isinstance(quiet, Quiet):
            await asyncio.sleep(POLL_S if reason == "reclaim" else DUE_POLL_S)
            return
        if reason != "reclaim":
            self.trigger.reached(self.trigger.due_for_s())  # how long reaching it took
        record = None
        try:
            record = self._maintain(quiet, reason)
        finally:
            waits = await self.quiescence.leave(quiet)
        self._report(quiet, reason, record, waits)

    def _reason(self) -> str | None:
        trigger = self.trigger
        if lifecycle.current_phase() is lifecycle.Phase.SERVING:
            held = self._hold_while_serving()
            # CPython's own counters (no walk): how much has grown, how near its next full one.
            if held:
                trigger.look_held(*_young_passes(self.hold))
            else:
                trigger.look_ahead(*_young_passes(self.hold))
        if trigger.due:
            return trigger.due_reason  # "pause" or "ahead"
        if not self.reclaim.withdraw and self.reclaim.since_reclaim >= IDLE_RECLAIM_EVERY:
            return "reclaim"  # overdue: run at the next long idle moment
        return None

    # -- one maintenance (synchronous: nothing else runs on the loop meanwhile) --------------

    def _maintain(self, quiet: Quiet, reason: str) -> MaintenanceRecord | None:
        trigger = self.trigger
        unfrozen = trigger.unfrozen_estimate()
        whole = None if unfrozen is None else self.frozen_estimate + unfrozen
        whole_walk_s = trigger.walk_estimate_s(whole)
        reclaim = reason == "reclaim" or self.reclaim.decide(
            whole_walk_s, self.quiescence.gate.idle_for_s()
        )
        if not reclaim and self.reclaim.overdue() and not self._pinned_said:
            self._pinned_said = True
            logger.warning(
                PINNED_LINE, self.context, self.reclaim.since_reclaim, whole_walk_s or 0.0
            )
        trigger.maintaining_candidates = None  # set by the window's own full collections
        passes, threshold = _young_passes(self.hold)  # a cycle's share grown since the last full
        try:
            with lifecycle.maintenance_window(reason, quiet.in_flight) as window:
                record = maintain_gc_heap(
                    window,
                    context=self.context,
                    reclaim=reclaim,
                    # The count walks the permanent generation: only where no client waits,
                    # and only when the whole heap is walked anyway.
                    count_frozen=quiet.mode == "withdraw" and reclaim,
                )
        except RuntimeError:  # not serving any more (a drain began): nothing to do
            return None
        if record is not None:
            cycles = trigger.cycles_since_maintained(passes, threshold)
            self._learn(record, cycles)
        return record

    def _learn(self, record: MaintenanceRecord, cycles: float) -> None:
        trigger = self.trigger
        examined_ms = record.reclaim_ms if record.reclaim else record.collect_ms
        assert examined_ms is not None
        examined = trigger.maintaining_candidates
        if examined is None and record.frozen is not None and record.reclaim:
            examined = record.frozen + record.reclaimed  # the whole heap, counted
        trigger.calibrate(examined, examined_ms / 1000.0)
        if record.frozen is not None:
            self.frozen_estimate = record.frozen
        else:
            walked = examined
            if walked is None and trigger.objects_per_s is not None:
                walked = round(trigger.objects_per_s * examined_ms / 1000.0)
            garbage = record.reclaimed if record.reclaim else record.collected
            kept = max(0, (walked or 0) - garbage)
            self.frozen_estimate = kept if record.reclaim else self.frozen_estimate + kept
        trigger.maintained(record.collect_ms / 1000.0, cycles)
        self.reclaim.done(record.reclaim)
        if record.reclaim:
            self._pinned_said = False
        self.maintenances += 1
        self.last = record
        self._warned_due_at = None
        self._hold_paused = False  # maintained again: the hold may be taken again

    # -- reports ------------------------------------------------------------------------------

    def _report(
        self, quiet: Quiet, reason: str, record: MaintenanceRecord | None, waits: list[float]
    ) -> None:
        closed_s = self._clock() - quiet.closed_at
        if self.metrics is not None:
            self.metrics.observe_waits(waits)
        if record is None:
            return
        frozen = str(record.frozen) if record.frozen is not None else f"~{self.frozen_estimate}"
        closed = "withdrawn" if quiet.mode == "withdraw" else "held"
        label = reason  # pause, ahead or reclaim
        logger.info(
            MAINTAINED_LINE,
            self.context,
            quiet.mode,
            label,
            record.took_ms,
            record.collected,
            record.reclaimed,
            frozen,
            closed,
            closed_s * 1000.0,
            len(waits),
            quiet.note,
        )
        self._warn_waits(waits)
        if self.metrics is not None:
            self.metrics.observe(
                mode=quiet.mode,
                reason=label,
                took_s=record.took_ms / 1000.0,
                withdrawn_s=closed_s,
                reclaimed=record.reclaimed,
            )

    def _gave_up(self, attempt: GaveUp) -> None:
        logger.info(
            GAVE_UP_LINE,
            self.context,
            attempt.mode,
            attempt.in_flight,
            attempt.closed_s * 1000.0,
            attempt.retry_s,
        )
        self._warn_waits(attempt.waits)
        if self.metrics is not None:
            self.metrics.observe_gave_up(attempt.mode)
            self.metrics.observe_waits(attempt.waits)

    def _warn_waits(self, waits: list[float]) -> None:
        longest_ms = max(waits, default=0.0) * 1000.0
        if self.pause_log_ms > 0 and longest_ms >= self.pause_log_ms:
            logger.warning(WAIT_LINE, self.context, len(waits), longest_ms)

    def _warn_if_overdue(self) -> None:
        due_for = self.trigger.due_for_s()
        if due_for >= DUE_WARNING_S and self._warned_due_at is None:
            self._warned_due_at = self._clock()
            logger.warning(DUE_LINE, self.context, due_for, self.quiescence.mode)
            # The heap grows unwalked while held: past this long, CPython collects it again.
            self._give_back(f"no maintenance for {due_for:.0f} s")
