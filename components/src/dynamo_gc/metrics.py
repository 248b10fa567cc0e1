"""Prometheus metrics of the GC layer: pause durations, the freeze, the serving phase.

One :class:`DynamoMetrics` per process, on a registry of its own (never prometheus_client's
global default), so a test can build two and scrape each without cross-talk. The registry also
carries the standard process and GC collectors.

Where each value comes from (no heap walk anywhere on these paths):

* ``dynamo_gc_pause_seconds{generation,phase}``: :meth:`DynamoMetrics.observe_pause`, the
  pause logger's ``on_pause`` sink, called from ``gc.callbacks`` for every collection. It bumps
  plain integers; the histogram is assembled only when scraped.
* ``dynamo_gc_frozen_objects`` / ``dynamo_gc_freeze_seconds``: set once per freeze by the freeze
  observer from the :class:`~dynamo_gc.freeze.FreezeRecord`; a scrape reads the
  stored numbers and never calls ``gc.get_freeze_count()`` (a walk of the permanent generation).
* ``dynamo_gc_freeze_enabled``: the process's freeze option, 1 or 0.
* ``dynamo_serving_phase{phase}``: 1 for the current phase, 0 for the others, updated by a
  lifecycle phase listener.

Why the pause histogram is not a ``prometheus_client.Histogram``: its ``observe`` takes a
non-reentrant ``threading.Lock`` per value touched (sum, bucket). A GC callback runs in whichever
thread triggered the collection, in the middle of whatever that thread was doing; if that ever
were a scrape holding one of those locks (prometheus_client's locked sections are tiny today,
but nothing promises they never reach a point where CPython starts a pending collection), the
callback would wait forever on a lock its own thread holds. Our sink takes no lock at all, which
is also cheaper: the callback is the only writer (collections never overlap, even across
threads), and a scrape only reads.
"""

from __future__ import annotations

import bisect
import gc
import logging
import os
import time
from collections.abc import Iterable

from prometheus_client import (
    CollectorRegistry,
    Gauge,
    GCCollector,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import HistogramMetricFamily, Metric

from dynamo_gc import lifecycle
from dynamo_gc.freeze import FreezeRecord, add_freeze_observer, last_freeze, remove_freeze_observer
from dynamo_gc.pause_logger import GENERATIONS, installed_gc_pause_logger

logger = logging.getLogger(__name__)

# 0.1 ms (a young collection) to 10 s (a full pass over tens of millions of objects).
PAUSE_BUCKETS_S: tuple[float, ...] = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)

PAUSE_METRIC = "dynamo_gc_pause_seconds"
FROZEN_OBJECTS_METRIC = "dynamo_gc_frozen_objects"
FREEZE_SECONDS_METRIC = "dynamo_gc_freeze_seconds"
FREEZE_ENABLED_METRIC = "dynamo_gc_freeze_enabled"
PHASE_METRIC = "dynamo_serving_phase"

METRICS_PATH = "/metrics"
DEBUG_GC_COLLECT_PATH = "/debug/gc/collect"
DEBUG_GC_STATE_PATH = "/debug/gc/state"


_PHASES = tuple(lifecycle.Phase)
_PHASE_INDEX = {phase: index for index, phase in enumerate(_PHASES)}


class PauseHistogram:
    """Pause buckets by (phase, generation) kept as plain integers, exported on scrape.

    The ``phase`` label separates what operators watch (pauses while ``serving``) from what
    every start pays (imports, engine init, the freeze's own collection while ``starting``), so
    a pod start does not show up as a serving p99 spike.
    """

    def __init__(self, bounds: Iterable[float] = PAUSE_BUCKETS_S) -> None:
        self.bounds = tuple(sorted(bounds))
        # One slot per finite bucket plus one for +Inf; not cumulative (the scrape sums them).
        self._counts = [[[0] * (len(self.bounds) + 1) for _ in range(GENERATIONS)] for _ in _PHASES]
        self._sums = [[0.0] * GENERATIONS for _ in _PHASES]

    def observe(self, generation: int, seconds: float) -> None:
        phase = _PHASE_INDEX[lifecycle.current_phase()]
        # bisect_left: the first bound >= seconds, i.e. Prometheus' "le" (value <= bound).
        self._counts[phase][generation][bisect.bisect_left(self.bounds, seconds)] += 1
        self._sums[phase][generation] += seconds

    def count(self, generation: int, phase: lifecycle.Phase | None = None) -> int:
        """Collections of ``generation`` observed (in ``phase``, or in any phase)."""
        phases = range(len(_PHASES)) if phase is None else (_PHASE_INDEX[phase],)
        return sum(sum(self._counts[index][generation]) for index in phases)

    def collect(self) -> Iterable[Metric]:
        family = HistogramMetricFamily(
            PAUSE_METRIC,
            "Duration of each CPython GC collection in this process, by generation and by the "
            "serving phase the process was in",
            labels=["generation", "phase"],
        )
        for phase_index, phase in enumerate(_PHASES):
            for generation in range(GENERATIONS):
                # One copy, so buckets and count agree.
                counts = list(self._counts[phase_index][generation])
                cumulative, buckets = 0, []
                # counts has one more slot than bounds: the +Inf bucket, added below from the total.
                for bound, count in zip(self.bounds, counts, strict=False):
                    cumulative += count
                    buckets.append((_le(bound), cumulative))
                buckets.append(("+Inf", cumulative + counts[-1]))
                family.add_metric(
                    [str(generation), phase.value], buckets, self._sums[phase_index][generation]
                )
        return [family]

    def describe(self) -> Iterable[Metric]:
        # Lets the registry check names without running collect() at registration.
        return [HistogramMetricFamily(PAUSE_METRIC, "", labels=["generation", "phase"])]


def _le(bound: float) -> str:
    return repr(float(bound))


class DynamoMetrics:
    """The metrics of one process and the registry they live on.

    Build it, :meth:`attach` it (freeze observer and phase listener), and give
    :meth:`observe_pause` to the pause logger::

        metrics = DynamoMetrics(freeze_enabled=config.freeze_gc_heap).attach()
        install_gc_pause_logger(config.gc_pause_log_ms, on_pause=metrics.observe_pause)
    """

    def __init__(self, *, freeze_enabled: bool, process_collectors: bool = True) -> None:
        self.registry = CollectorRegistry()
        if process_collectors:
            ProcessCollector(registry=self.registry)
            GCCollector(registry=self.registry)
        self.pauses = PauseHistogram()
        self.registry.register(self.pauses)
        self.frozen_objects = Gauge(
            FROZEN_OBJECTS_METRIC,
            "Objects moved into the permanent GC generation by the last heap freeze "
            "(0 before the first freeze)",
            registry=self.registry,
        )
        self.freeze_seconds = Gauge(
            FREEZE_SECONDS_METRIC,
            "How long the last heap freeze (collect every generation, freeze, count) took",
            registry=self.registry,
        )
        self.freeze_enabled = Gauge(
            FREEZE_ENABLED_METRIC,
            "1 when this process is configured to freeze its GC heap at start-up, else 0",
            registry=self.registry,
        )
        self.phase = Gauge(
            PHASE_METRIC,
            "Serving phase of this process: 1 for the current phase, 0 for the others",
            labelnames=["phase"],
            registry=self.registry,
        )
        self.freeze_enabled.set(1 if freeze_enabled else 0)
        self.set_phase(lifecycle.current_phase())
        self._attached = False

    # -- sinks -----------------------------------------------------------------------------

    def observe_pause(self, generation: int, seconds: float) -> None:
        """The pause logger's ``on_pause``: runs inside ``gc.callbacks``, so no lock, no walk."""
        self.pauses.observe(generation, seconds)

    def observe_freeze(self, record: FreezeRecord) -> None:
        """A freeze observer: copy the numbers the freeze already measured."""
        self.frozen_objects.set(record.frozen)
        self.freeze_seconds.set(record.took_ms / 1000.0)

    def set_phase(self, phase: lifecycle.Phase) -> None:
        for each in lifecycle.Phase:
            self.phase.labels(phase=each.value).set(1 if each is phase else 0)

    # -- wiring ----------------------------------------------------------------------------

    def attach(self) -> DynamoMetrics:
        """Follow this process's freezes and phase changes; seed from what already happened."""
        if not self._attached:
            add_freeze_observer(self.observe_freeze)
            lifecycle.add_phase_listener(self.set_phase)
            self._attached = True
        previous = last_freeze()
        if previous is not None:
            self.observe_freeze(previous)
        self.set_phase(lifecycle.current_phase())
        return self

    def detach(self) -> None:
        remove_freeze_observer(self.observe_freeze)
        lifecycle.remove_phase_listener(self.set_phase)
        self._attached = False

    def render(self) -> bytes:
        """The Prometheus text exposition of every metric on this registry."""
        return generate_latest(self.registry)


def debug_gc_collect(metrics: DynamoMetrics | None = None) -> dict:
    """Run one full ``gc.collect()`` in this process and say what it did.

    The process pauses for the length of the collection (after a freeze that is short: frozen
    objects are not walked). The answer says how many generation-2 collections CPython counted
    during the call and, given ``metrics``, the ``dynamo_gc_pause_seconds`` generation-2 count
    of the current phase before and after it. Automatic collection is switched off for the few
    lines around the call, so no automatic collection can land between the readings: both
    deltas are exactly 1.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        cpython_before = gc.get_stats()[2]["collections"]
        phase = lifecycle.current_phase()  # the histogram's phase label this call lands in
        recorded_before = metrics.pauses.count(2, phase) if metrics is not None else None
        started = time.perf_counter()
        collected = gc.collect()
        took_s = time.perf_counter() - started
        cpython_after = gc.get_stats()[2]["collections"]
        recorded_after = metrics.pauses.count(2, phase) if metrics is not None else None
    finally:
        if was_enabled:
            gc.enable()
    result = {
        "generation": 2,
        "collected": collected,
        "took_ms": took_s * 1000.0,
        "gen2_collections_delta": cpython_after - cpython_before,
        "pause_histogram_gen2_count_before": recorded_before,
        "pause_histogram_gen2_count_after": recorded_after,
    }
    logger.warning(
        "Debug GC collection via %s: collected=%d took_ms=%.1f",
        DEBUG_GC_COLLECT_PATH,
        collected,
        result["took_ms"],
    )
    return result


def debug_gc_state() -> dict:
    """This process's GC configuration and frozen-object count, for checks by hand and tests.

    ``frozen_objects`` walks the permanent generation (milliseconds per 100k objects), and
    ``generation_objects`` lists every tracked object once (tens of milliseconds on a heap of
    600k): that is why this lives behind the debug switch and is never scraped. With
    ``generation_objects`` and ``counts`` (CPython's allocation and collection counters) a
    benchmark sees what moves a process towards its next full collection: CPython starts one
    when the objects promoted into generation 2 since the last one exceed a quarter of those it
    left there. ``pause_logger`` holds the installed pause logger's counters (collections and
    logged pauses per generation, max and total pause).
    """
    pause_logger = installed_gc_pause_logger()
    return {
        "pid": os.getpid(),
        "phase": lifecycle.current_phase().value,
        "thresholds": list(gc.get_threshold()),
        "isenabled": gc.isenabled(),
        "frozen_objects": gc.get_freeze_count(),
        "generation_objects": [len(gc.get_objects(generation)) for generation in range(3)],
        "counts": list(gc.get_count()),
        "pause_logger": None if pause_logger is None else pause_logger.snapshot(),
    }
