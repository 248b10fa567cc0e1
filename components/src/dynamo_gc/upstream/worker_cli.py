"""One launcher for both upstream worker adapters: GC flags out, hook checked and wrapped, then
upstream's own ``python -m`` entry point runs as always.

Order, so that nothing is half-applied: ``--help`` prints ours then upstream's; otherwise the GC
options are parsed (bad value: exit 2, before upstream is imported), the step upstream's
``__main__`` runs before it imports its engine module runs first here too (the vLLM worker's
checkpoint/restore standby mode, which must not import vLLM: it captures the env and execs
``sleep``, never returning), the hooked symbol is
resolved and checked against the installed ai-dynamo (exit 2 naming the version and the symbol),
the pause logger and metrics are installed (and served on their own port when
``--gc-metrics-port`` asks: upstream's worker ``/metrics`` is its Rust runtime's), the global is
wrapped (and, for the vLLM worker, upstream's ``--embedding-worker-processes`` children routed
through the adapter: :mod:`.embedding_children`), and upstream's ``__main__`` runs with the
remaining arguments. Where the installed ai-dynamo freezes the worker itself
(:mod:`.stand_down`), nothing is installed: one line, and upstream gets the GC flags too.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import logging
import runpy
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from dynamo_gc.configuration.options import Surface
from dynamo_gc.upstream import (
    embedding_children,
    hooks,
    metrics_server,
    stand_down,
    versions,
    worker_freeze,
    worker_settings,
)
from dynamo_gc.upstream.hooks import ModuleGlobalHook

logger = logging.getLogger(__name__)

METRICS_OPTION = "--gc-metrics-port / DYN_VLLM_GC_METRICS_PORT"


@dataclass(frozen=True)
class WorkerAdapter:
    surface: Surface
    # Every global after whose first call the process is registered (the first one named is
    # the main path); each is checked, and all share one freeze.
    hooks: tuple[ModuleGlobalHook, ...]
    entry_module: str  # upstream's ``python -m`` package, run as ``__main__``: "dynamo.vllm"
    freeze_context: str  # what the freeze line and the guard's warnings say
    admission: str  # why the process turns ``serving``
    # ``module:function`` that upstream's ``__main__`` calls before importing the hooked module,
    # and that returns only when the process is to go on (the vLLM worker's restore standby
    # check); resolving the hooks would import what upstream keeps out until then.
    before_engine_import: str | None = None
    # Upstream's --embedding-worker-processes children (the vLLM worker's) start through the
    # adapter too (:mod:`.embedding_children`).
    embedding_children: bool = False

    def parse_args(
        self, argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None
    ) -> argparse.Namespace:
        """The GC options alone, as the configuration tests read every program."""
        return worker_settings.parse_args(self.surface, argv, env)

    def main(self) -> None:
        """The ``python -m`` entry point."""
        run(self)


def _run_upstream(adapter: WorkerAdapter, args: list[str]) -> None:
    # alter_sys=False: runpy would set sys.argv[0] to upstream's __main__.py, and upstream's
    # parser would head its help and its errors "usage: __main__.py"; they name this program.
    sys.argv = [adapter.surface.program, *args]
    runpy.run_module(adapter.entry_module, run_name="__main__", alter_sys=False)


def run(adapter: WorkerAdapter, argv: Sequence[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    program = adapter.surface.program
    if "--help" in args or "-h" in args:
        print(worker_settings.format_help(adapter.surface))
        for hook in adapter.hooks:  # exit 2 here too on an unsupported version
            hooks.resolve(program, hook)
        print("Upstream ai-dynamo's own options follow.\n", flush=True)
        _run_upstream(adapter, ["--help"])
        return
    config, rest = worker_settings.split_args(adapter.surface, args)
    settings = config.gc
    if adapter.before_engine_import is not None:
        _run_before_engine_import(adapter.before_engine_import)
    for hook in adapter.hooks:  # all checked before anything is installed
        hooks.resolve(program, hook)
    upstream = importlib.import_module(adapter.hooks[0].module)
    if adapter.embedding_children:
        embedding_children.checked_function(program, upstream)
    versions.warn_if_unchecked(program)
    own_freeze = stand_down.upstream_freeze_in(upstream)
    if own_freeze is not None:
        # Upstream freezes this process itself: its parser gets the GC flags (the same names),
        # the adapter keeps only its metrics options, and installs nothing.
        lost = [] if config.metrics_port is None else [f"{METRICS_OPTION} ({config.metrics_port})"]
        stand_down.stand_down(program, own_freeze, lost)
        _run_upstream(adapter, worker_settings.without_metrics_options(adapter.surface, args))
        return
    metrics = worker_freeze.install_observers(settings)
    if config.metrics_port is not None:
        metrics_server.serve(
            metrics,
            config.metrics_host,
            config.metrics_port,
            option=METRICS_OPTION,
        )
    freeze = worker_freeze.FreezeOnce(
        settings, context=adapter.freeze_context, admission=adapter.admission
    )
    if adapter.embedding_children:
        embedding_children.install(
            program,
            upstream,
            freeze_gc_heap=settings.freeze_gc_heap,
            gc_pause_log_ms=settings.gc_pause_log_ms,
            metrics=None
            if config.metrics_port is None
            else (config.metrics_host, config.metrics_port),
        )
    for hook in adapter.hooks:
        hooks.wrap(
            program,
            hook,
            functools.partial(
                worker_freeze.freezing_wrapper, freeze=freeze, coroutine=hook.coroutine
            ),
        )
    _run_upstream(adapter, rest)


def _run_before_engine_import(target: str) -> None:
    """Upstream's pre-import step, as its ``__main__`` runs it (which runs it again, a no-op then).

    An upstream without it has nothing to keep out: the hooks' own checks decide the rest.
    """
    module_name, _, name = target.partition(":")
    try:
        step = getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError) as exc:
        logger.debug("No %s in this ai-dynamo (%s): nothing runs before the hooks", target, exc)
        return
    step()
