"""The serving-time maintenance's Prometheus metrics, on the process's registry.

Registered only when maintenance is on (``off`` adds nothing to ``/metrics``). Every value is
set by the maintainer on its event loop, or read at scrape time from what the trigger already
holds: nothing here walks the heap, and nothing runs inside a GC callback (so these may use
prometheus_client's own locked types, unlike ``dynamo_gc_pause_seconds``). Label values are
bounded: ``mode`` is ``idle`` or ``withdraw``, ``reason`` is ``pause``, ``ahead`` or ``reclaim``.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from dynamo_gc.full_collection_hold import FullCollectionHold
from dynamo_gc.maintenance_trigger import MaintenanceTrigger
from dynamo_gc.metrics import PAUSE_BUCKETS_S

MODES = ("idle", "withdraw")
REASONS = ("pause", "ahead", "reclaim")

MAINTENANCE_TOTAL_METRIC = "dynamo_gc_maintenance"  # exposed as dynamo_gc_maintenance_total
MAINTENANCE_SECONDS_METRIC = "dynamo_gc_maintenance_seconds"
WITHDRAWN_SECONDS_METRIC = "dynamo_gc_maintenance_withdrawn_seconds"
WAIT_SECONDS_METRIC = "dynamo_gc_maintenance_wait_seconds"
RECLAIMED_METRIC = "dynamo_gc_maintenance_reclaimed_objects"  # ..._total
GAVE_UP_METRIC = "dynamo_gc_maintenance_gave_up"  # ..._total
DUE_METRIC = "dynamo_gc_maintenance_due"
UNFROZEN_ESTIMATE_METRIC = "dynamo_gc_unfrozen_objects_estimate"
HELD_METRIC = "dynamo_gc_full_collections_held"

# How long the process took no new requests: from a few milliseconds (an idle moment) to the
# withdrawal's bound (in-flight requests finishing, up to the drain timeout).
WITHDRAWN_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class MaintenanceMetrics:
    """The maintenance's series; ``trigger`` feeds the two read at scrape time."""

    def __init__(self, registry: CollectorRegistry, trigger: MaintenanceTrigger) -> None:
        self.maintenances = Counter(
            MAINTENANCE_TOTAL_METRIC,
            "Serving-time GC maintenances done, by mode (idle: admission held in place; "
            "withdraw: out of routing) and reason (pause: a serving full collection reached "
            "half the pause budget; ahead: run before any full collection did, when the "
            "unfrozen heap's estimated walk reached half the budget; reclaim: a scheduled "
            "reclaim of the garbage the frozen generation pinned)",
            labelnames=["mode", "reason"],
            registry=registry,
        )
        self.duration = Histogram(
            MAINTENANCE_SECONDS_METRIC,
            "How long a maintenance's own GC work took (collect, the reclaim's unfreeze and "
            "full collection when it reclaims, freeze), nothing admitted and nothing in flight",
            labelnames=["mode"],
            buckets=PAUSE_BUCKETS_S,
            registry=registry,
        )
        self.withdrawn = Histogram(
            WITHDRAWN_SECONDS_METRIC,
            "How long the process took no new requests for a maintenance: out of routing "
            "(withdraw) or with its admission held (idle), the wait for requests in flight "
            "included",
            labelnames=["mode"],
            buckets=WITHDRAWN_BUCKETS_S,
            registry=registry,
        )
        self.waits = Histogram(
            WAIT_SECONDS_METRIC,
            "How long a request waited at the admission held for an idle maintenance: a pause "
            "that request saw",
            buckets=PAUSE_BUCKETS_S,
            registry=registry,
        )
        self.reclaimed = Counter(
            RECLAIMED_METRIC,
            "Objects reclaimed by maintenances from the frozen generation: cyclic garbage "
            "that freezing had pinned",
            registry=registry,
        )
        self.gave_up = Counter(
            GAVE_UP_METRIC,
            "Maintenance attempts given up because requests in flight did not finish within "
            "the bound (admission reopened, tried again later)",
            labelnames=["mode"],
            registry=registry,
        )
        due = Gauge(
            DUE_METRIC,
            "1 while a maintenance is due and has not run yet, else 0",
            registry=registry,
        )
        due.set_function(lambda: 1.0 if trigger.due else 0.0)
        estimate = Gauge(
            UNFROZEN_ESTIMATE_METRIC,
            "Estimated objects outside the frozen generation: as the last serving full "
            "collection saw them (its pause at the calibrated walk rate; CPython 3.15: the "
            "objects it examined), or, with full collections held off, the walk estimated "
            "from CPython's counters since at that rate; 0 until known",
            registry=registry,
        )
        estimate.set_function(lambda: float(trigger.unfrozen_estimate() or 0))
        self.held = Gauge(
            HELD_METRIC,
            "1 while CPython's automatic full collections are held off for the maintainer to "
            "run at quiescent moments, else 0 (not serving yet, given back after a minute "
            "without a maintenance or a failure, or a build that cannot hold them)",
            registry=registry,
        )
        self.held.set_function(lambda: 0.0)  # until a maintainer's hold is watched
        for mode in MODES:  # every series from the start, so a rate() sees the first one
            self.duration.labels(mode=mode)
            self.withdrawn.labels(mode=mode)
            self.gave_up.labels(mode=mode)
            for reason in REASONS:
                self.maintenances.labels(mode=mode, reason=reason)

    def observe(
        self, *, mode: str, reason: str, took_s: float, withdrawn_s: float, reclaimed: int
    ) -> None:
        self.maintenances.labels(mode=mode, reason=reason).inc()
        self.duration.labels(mode=mode).observe(took_s)
        self.withdrawn.labels(mode=mode).observe(withdrawn_s)
        if reclaimed:
            self.reclaimed.inc(reclaimed)

    def observe_waits(self, waits: list[float]) -> None:
        for wait in waits:
            self.waits.observe(wait)

    def watch_hold(self, hold: FullCollectionHold) -> None:
        """The held gauge reads ``hold`` at scrape time (a maintainer's, once it exists)."""
        self.held.set_function(lambda: 1.0 if hold.held else 0.0)

    def observe_gave_up(self, mode: str) -> None:
        self.gave_up.labels(mode=mode).inc()
