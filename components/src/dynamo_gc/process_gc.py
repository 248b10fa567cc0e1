"""What a launcher sets up for its process's GC at start: the metrics and the pause logger.

One call for every launcher that hosts the layer, ours and the adapters into upstream's: the
``dynamo_gc_*`` metrics follow the process's freezes and phase changes, and the pause logger
feeds them every collection's pause. :class:`~dynamo_gc.gc_state.ProcessGcState` undoes it all
(and unfreezes a heap this process froze) once everything else has stopped.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from dynamo_gc import pause_logger
from dynamo_gc.configuration.gc_options import GcSettings
from dynamo_gc.gc_state import ProcessGcState
from dynamo_gc.metrics import DynamoMetrics

logger = logging.getLogger(__name__)


@dataclass
class ProcessGc:
    """The process's GC instrumentation: its metrics, and the state to put back at the end."""

    metrics: DynamoMetrics
    state: ProcessGcState


def start_process_gc(gc: GcSettings) -> ProcessGc:
    """Metrics and the pause logger. The logger is installed even with the log off (0): every
    pause feeds ``dynamo_gc_pause_seconds``."""
    metrics = DynamoMetrics(freeze_enabled=gc.freeze_gc_heap).attach()
    state = ProcessGcState(metrics)
    # Through the module, so a test that wraps the install sees this call.
    pause_logger.install_gc_pause_logger(gc.gc_pause_log_ms, on_pause=metrics.observe_pause)
    if gc.gc_pause_log_ms <= 0:
        logger.info(
            "GC pause logger off (gc_pause_log_ms=0); pauses still recorded in "
            "dynamo_gc_pause_seconds"
        )
    return ProcessGc(metrics, state)
