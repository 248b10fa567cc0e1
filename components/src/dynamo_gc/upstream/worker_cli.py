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
through the adapter with the same GC and maintenance settings: :mod:`.embedding_children`), and
upstream's ``__main__`` runs with the remaining arguments. An adapter whose upstream installs its
signal handlers before a long start-up (the vLLM worker: ``signal_hook``) keeps SIGINT and
SIGTERM from before its hooks are resolved until the freeze point (:mod:`.worker_signals`): a stop
during start-up is one line and a prompt exit 0. Where the installed ai-dynamo freezes the worker
itself (:mod:`.stand_down`), nothing is installed (no freeze, no pause logger, no maintenance, no
signal handling of the adapter's): one line, and upstream gets the GC flags it shares.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import logging
import runpy
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dynamo_gc.configuration.options import Surface
from dynamo_gc.upstream import (
    embedding_children,
    hooks,
    interrupts,
    metrics_server,
    served_maintenance,
    stand_down,
    versions,
    worker_freeze,
    worker_settings,
    worker_signals,
)
from dynamo_gc.upstream.hooks import ModuleGlobalHook
from dynamo_gc.upstream.request_gate import RequestPath

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
    # Upstream's function that installs its shutdown signal handlers before start-up ends (the
    # vLLM worker's ``install_signal_handlers``): deferred to the freeze point, the adapter's
    # handlers stopping start-up meanwhile (:mod:`.worker_signals`). None: upstream's as they are.
    signal_hook: ModuleGlobalHook | None = None
    # Where each request the worker serves passes through Python (its handlers' generate
    # methods): gated for the serving-time maintenance (:mod:`.served_maintenance`). Empty: the
    # worker cannot host it (its surface declares no maintenance option).
    request_paths: tuple[RequestPath, ...] = ()
    # Why a hooked call registers something served by another path (None: by a gated one).
    ungated: Callable[[Any], str | None] | None = None

    @property
    def checked_hooks(self) -> tuple[ModuleGlobalHook, ...]:
        """Every global the adapter wraps, all checked before anything is installed."""
        return (*self.hooks, *((self.signal_hook,) if self.signal_hook else ()))

    def parse_args(
        self, argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None
    ) -> argparse.Namespace:
        """The GC options alone, as the configuration tests read every program."""
        return worker_settings.parse_args(self.surface, argv, env)

    def main(self) -> None:
        """The ``python -m`` entry point (Ctrl-C before upstream starts: :mod:`.interrupts`)."""
        interrupts.stoppable(self.surface.program)(run)(self)


def _run_upstream(adapter: WorkerAdapter, args: list[str]) -> None:
    # alter_sys=False: runpy would set sys.argv[0] to upstream's __main__.py, and upstream's
    # parser would head its help and its errors "usage: __main__.py"; they name this program.
    sys.argv = [adapter.surface.program, *args]
    interrupts.hand_over()
    runpy.run_module(adapter.entry_module, run_name="__main__", alter_sys=False)


def run(adapter: WorkerAdapter, argv: Sequence[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    program = adapter.surface.program
    if "--help" in args or "-h" in args:
        print(worker_settings.format_help(adapter.surface))
        for hook in adapter.checked_hooks:  # exit 2 here too on an unsupported version
            hooks.resolve(program, hook)
        print("Upstream ai-dynamo's own options follow.\n", flush=True)
        _run_upstream(adapter, ["--help"])
        return
    config, rest = worker_settings.split_args(adapter.surface, args)
    if adapter.signal_hook is None:
        _start(adapter, config, args, rest, None)
        return
    signals = worker_signals.StartupSignals(adapter.surface.program)
    signals.install()
    try:
        _start(adapter, config, args, rest, signals)
    except BaseException:
        if signals.stopping:  # whatever the stop made start-up raise: the stop ends the process
            signals.wait_for_stop()
        raise


def _start(
    adapter: WorkerAdapter,
    config: worker_settings.WorkerGcConfig,
    args: list[str],
    rest: list[str],
    signals: worker_signals.StartupSignals | None,
) -> None:
    program = adapter.surface.program
    settings = config.gc
    if adapter.before_engine_import is not None:
        _run_before_engine_import(adapter.before_engine_import)
    for hook in adapter.checked_hooks:  # all checked before anything is installed
        hooks.resolve(program, hook)
    upstream = importlib.import_module(adapter.hooks[0].module)
    if adapter.embedding_children:
        embedding_children.checked_function(program, upstream)
    versions.warn_if_unchecked(program)
    own_freeze = stand_down.upstream_freeze_in(upstream)
    if own_freeze is not None:
        # Upstream freezes this process itself: its parser gets the GC flags it shares (the same
        # names), the adapter's own (metrics, maintenance) are taken out, nothing is installed,
        # and upstream's signal handlers are its own again.
        stand_down.stand_down(program, own_freeze, worker_settings.not_served(config))
        if signals is not None:
            signals.hand_over()
        _run_upstream(adapter, worker_settings.without_adapter_options(adapter.surface, args))
        return
    adapter_gc = served_maintenance.observe(
        program,
        settings,
        config.maintenance,
        paths=adapter.request_paths,
        context=adapter.freeze_context,
        ungated=adapter.ungated,
    )
    if config.metrics_port is not None:
        metrics_server.serve(
            adapter_gc.metrics,
            config.metrics_host,
            config.metrics_port,
            option=METRICS_OPTION,
        )
    freeze = worker_freeze.FreezeOnce(
        settings,
        context=adapter.freeze_context,
        admission=adapter.admission,
        before=signals.hand_over if signals is not None else None,
        after_freeze=adapter_gc.frozen,
        on_serving=adapter_gc.serve,
    )
    if adapter.embedding_children:
        embedding_children.install(
            program,
            upstream,
            settings,
            config.maintenance,
            metrics=None
            if config.metrics_port is None
            else (config.metrics_host, config.metrics_port),
        )
    if signals is not None and adapter.signal_hook is not None:
        hooks.wrap(program, adapter.signal_hook, signals.defer)
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
