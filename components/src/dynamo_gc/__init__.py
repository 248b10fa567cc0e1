"""The GC layer: freeze CPython's GC heap at a serving process's quiescent start-up point, and
measure every collection's pause, without lengthening it.

One implementation, two places it plugs in. The core is this package's modules, which import
nothing but the standard library, ConfigArgParse and prometheus_client:

* :mod:`dynamo_gc.lifecycle`: the serving phase (starting, serving, maintaining, draining) and
  the guard that allows a freeze only while the process admits nothing;
* :mod:`dynamo_gc.freeze`: collect, freeze, log one line, tell the observers;
* :mod:`dynamo_gc.pause_logger`: the ``gc.callbacks`` entry that times each collection;
* :mod:`dynamo_gc.gc_state`: snapshot and restore of the process's GC state, and what a launcher
  undoes at exit;
* :mod:`dynamo_gc.metrics`: the ``dynamo_gc_*`` Prometheus metrics (no HTTP: whoever serves them
  adds the route);
* :mod:`dynamo_gc.process_gc`: a launcher's one start-up call (metrics attached, pause logger
  installed), undone by ``ProcessGcState``;
* :mod:`dynamo_gc.configuration`: option declarations, value kinds, the strict parser, and the
  two GC options per surface;
* :mod:`dynamo_gc.bench_policy` and :mod:`dynamo_gc.bench_policy_config`: the self-benchmark's GC
  policy (no automatic full collection inside a measured window);
* the serving-time maintenance (``--gc-maintenance``): :mod:`dynamo_gc.maintenance` (collect and
  freeze again inside a maintenance window), :mod:`dynamo_gc.maintenance_trigger` (when, from
  the pause logger's timings), :mod:`dynamo_gc.admission` (the gate a maintenance closes),
  :mod:`dynamo_gc.maintainer` (the task, and ``idle``), :mod:`dynamo_gc.maintenance_metrics`.

Where it plugs in: our own launchers (the ``dynamo`` package of the launchers' distribution,
under ``components/``) call the core directly; :mod:`dynamo_gc.upstream` holds the adapters that
hook it into the real ai-dynamo launchers (``python -m dynamo_gc.frontend``, ``.vllm``,
``.mocker``). Nothing here imports either: the core is the bottom floor.
"""
