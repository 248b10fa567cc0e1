"""What a launcher sets up for its process's GC at start: the metrics and the pause logger.

One call for every launcher that hosts the layer, ours and the adapters into upstream's: the
``dynamo_gc_*`` metrics follow the process's freezes and phase changes, and the pause logger
feeds them every collection's pause. :class:`~dynamo_gc.gc_state.ProcessGcState` undoes it all
(and unfreezes a heap this process froze) once everything else has stopped.

With serving-time maintenance on, the pause logger also feeds the maintenance's trigger, and
the maintenance's metrics join the registry; the launcher builds the maintainer once it serves
(:func:`idle_maintainer`, or its own quiescence for ``withdraw``). With it off, nothing of it
exists: no trigger, no metrics, no task.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from dynamo_gc import pause_logger
from dynamo_gc.admission import AdmissionGate
from dynamo_gc.configuration.gc_options import GcSettings, MaintenanceSettings
from dynamo_gc.full_collection_hold import FullCollectionHold
from dynamo_gc.gc_builds import unsound_build_reason
from dynamo_gc.gc_state import ProcessGcState
from dynamo_gc.maintainer import GcMaintainer, IdleQuiescence, Quiescence
from dynamo_gc.maintenance_metrics import MaintenanceMetrics
from dynamo_gc.maintenance_trigger import MaintenanceTrigger
from dynamo_gc.metrics import DynamoMetrics

logger = logging.getLogger(__name__)

# Builds whose collector is not the generational one the trigger reads (docs/pythons.md).
UNSOUND_BUILD_LINE = (
    "GC maintenance on %s: each maintenance's freeze costs more, and the trigger (a serving "
    "full collection's pause) may see none; the pause histogram shows what happens"
)


@dataclass
class GcMaintenance:
    """The serving-time maintenance's parts that exist from start-up: its settings, the
    trigger the pause logger feeds, and its metrics."""

    settings: MaintenanceSettings
    trigger: MaintenanceTrigger
    metrics: MaintenanceMetrics

    def maintainer(
        self, quiescence: Quiescence, *, context: str, pause_log_ms: float
    ) -> GcMaintainer:
        return GcMaintainer(
            self.trigger,
            quiescence,
            context=context,
            pause_log_ms=pause_log_ms,
            metrics=self.metrics,
            hold=FullCollectionHold(context),
        )

    def idle_quiescence(self, gate: AdmissionGate) -> IdleQuiescence:
        """``idle``'s way to quiescence on ``gate``: under load, admission is held for at most
        the pause budget while the requests in flight finish."""
        return IdleQuiescence(gate, hold_bound_s=self.settings.pause_budget_ms / 1000.0)


@dataclass
class ProcessGc:
    """The process's GC instrumentation: its metrics, and the state to put back at the end."""

    metrics: DynamoMetrics
    state: ProcessGcState
    maintenance: GcMaintenance | None = None


def start_process_gc(gc: GcSettings, maintenance: MaintenanceSettings | None = None) -> ProcessGc:
    """Metrics and the pause logger. The logger is installed even with the log off (0): every
    pause feeds ``dynamo_gc_pause_seconds`` (and, with maintenance on, its trigger)."""
    metrics = DynamoMetrics(freeze_enabled=gc.freeze_gc_heap).attach()
    state = ProcessGcState(metrics)
    parts = None
    if maintenance is not None and maintenance.enabled:
        trigger = MaintenanceTrigger(maintenance.pause_budget_ms)
        parts = GcMaintenance(maintenance, trigger, MaintenanceMetrics(metrics.registry, trigger))
    # Through the module, so a test that wraps the install sees this call.
    pause_logger.install_gc_pause_logger(
        gc.gc_pause_log_ms,
        on_pause=metrics.observe_pause,
        on_collection=None if parts is None else parts.trigger.on_collection,
    )
    if gc.gc_pause_log_ms <= 0:
        logger.info(
            "GC pause logger off (gc_pause_log_ms=0); pauses still recorded in "
            "dynamo_gc_pause_seconds"
        )
    if parts is not None:
        logger.info(
            "GC maintenance %s: due when the unfrozen heap's walk reaches %g ms (half the %g ms "
            "budget)",
            parts.settings.mode,
            parts.trigger.due_at_s * 1000.0,
            parts.settings.pause_budget_ms,
        )
        unsound = unsound_build_reason()
        if unsound is not None:
            logger.warning(UNSOUND_BUILD_LINE, unsound)
    return ProcessGc(metrics, state, parts)
