"""The serving-time maintenance (``idle``) in upstream's processes, through the adapters.

What our launchers do with ``--gc-maintenance idle`` / ``--dyn-gc-maintenance idle``, done in an
upstream process with the same layer parts (:mod:`dynamo_gc.process_gc`, the trigger fed by the
pause logger, the maintainer and its idle quiescence on an admission gate), in three steps:

1. :func:`observe`, before upstream starts: the pause logger and the metrics (with the
   maintenance's trigger and metrics when it is on), and every request path of upstream's that
   the process serves put through the admission gate (:mod:`.request_gate`, each symbol checked:
   exit 2 when one moved);
2. :meth:`AdapterGc.frozen`, at the freeze point, right after the start-up freeze: the settling
   pass (the maintenance's counting starts from the unfrozen heap, as in our launchers);
3. :meth:`AdapterGc.serve`, once the process serves, on the event loop the requests run on:
   the maintainer task.

``withdraw`` is not offered: upstream ai-dynamo 1.6.1 can take an instance out of routing and
back (``Endpoint.unregister_endpoint_instance`` / ``register_endpoint_instance``, what its own
sleep and wake use), but its Python API has no lock and no per-instance state in discovery
through which the instances of a model could agree that at most one is out at a time and never
the last one: docs/ai-dynamo.md.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dynamo_gc.admission import AdmissionGate
from dynamo_gc.configuration.gc_options import GcSettings, MaintenanceSettings
from dynamo_gc.maintainer import GcMaintainer
from dynamo_gc.maintenance import settle_after_freeze
from dynamo_gc.metrics import DynamoMetrics
from dynamo_gc.process_gc import GcMaintenance, start_process_gc
from dynamo_gc.upstream import request_gate
from dynamo_gc.upstream.request_gate import RequestPath

logger = logging.getLogger(__name__)


@dataclass
class AdapterGc:
    """The GC instrumentation an adapter installed, and its maintenance when on."""

    metrics: DynamoMetrics
    context: str
    pause_log_ms: float
    maintenance: GcMaintenance | None = None
    gate: AdmissionGate | None = None
    maintainer: GcMaintainer | None = None
    program: str = ""
    # Why what the hooked call registers is served by a request path the gate does not see
    # (None: it is gated); the adapter's, from the call's arguments.
    ungated: Callable[[Any], str | None] | None = None

    def frozen(self, frozen: int | None) -> None:
        """The start-up freeze ran (``frozen``: its count, None when refused or off): with the
        maintenance on, the settling pass, so CPython's rule counts from the unfrozen heap."""
        if self.maintenance is not None and frozen is not None:
            settle_after_freeze()

    def serve(self, call: Any = None) -> GcMaintainer | None:
        """Start the maintainer on the running event loop (the one upstream's requests run
        on); once per process. ``call``: the hooked call that registers what the process
        serves; when that is served by a request path the gate does not see, the process exits
        2 before it registers (a maintenance could collect with its requests in flight)."""
        if self.maintenance is None or self.gate is None or self.maintainer is not None:
            return self.maintainer
        reason = None if self.ungated is None else self.ungated(call)
        if reason is not None:
            mode = self.maintenance.settings.mode
            print(
                f"{self.program}: error: --gc-maintenance {mode} cannot run here: {reason}; "
                "run it with the maintenance off",
                file=sys.stderr,
                flush=True,
            )
            raise SystemExit(2)
        asyncio.get_running_loop()  # where the gate's waits and the maintainer must run
        self.maintainer = self.maintenance.maintainer(
            self.maintenance.idle_quiescence(self.gate),
            context=self.context,
            pause_log_ms=self.pause_log_ms,
        )
        self.maintainer.start()
        return self.maintainer


def observe(
    program: str,
    gc: GcSettings,
    maintenance: MaintenanceSettings,
    *,
    paths: tuple[RequestPath, ...],
    context: str,
    ungated: Callable[[Any], str | None] | None = None,
) -> AdapterGc:
    """The pause logger and metrics from start-up on; with the maintenance on, its trigger and
    metrics, and ``paths`` through a new admission gate (all checked first: exit 2 when one is
    not where the adapter expects it)."""
    gate = None
    if maintenance.enabled:
        gate = AdmissionGate()
        request_gate.gate_requests(program, paths, gate)
    process = start_process_gc(gc, maintenance)
    return AdapterGc(
        process.metrics,
        context,
        gc.gc_pause_log_ms,
        maintenance=process.maintenance,
        gate=gate,
        program=program,
        ungated=ungated,
    )
