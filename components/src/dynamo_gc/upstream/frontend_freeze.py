"""The ``gc-freeze`` route extension: freeze upstream ai-dynamo's frontend before it admits.

Upstream's ``dynamo/frontend/main.py:async_main`` builds the engine (``make_engine``), then calls
every provider named by ``--frontend-route-extension`` / ``DYN_FRONTEND_ROUTE_EXTENSIONS`` once
(``load_frontend_route_extensions``), then starts HTTP (``run_input``). That call is the last
point before the process admits a request, and it is reached without editing upstream: the
provider here is registered as ``gc-freeze`` in the ``dynamo.frontend.routes`` entry-point group.

What it does there, once per process however many ways it was named: check upstream's frontend
as ``python -m dynamo_gc.frontend`` checks it before starting upstream (every hooked symbol there,
else an exit 2 naming the installed version and the symbol; a version the adapter was not checked
with, a WARNING) when upstream's own command reached the provider (the launcher has checked by
then); read the GC options (from the launcher's flags when it configured them, else from the env
vars); install the pause logger and the metrics, wrap the preprocess pool's initializer,
collect and freeze, and mark the process ``serving`` (so the model watcher's
``chat_engine_factory``, which runs later, cannot freeze). Upstream's extension routes answer
JSON, which Prometheus cannot scrape, so the ``dynamo_gc_*`` metrics get a port of their own when
``DYN_GC_METRICS_PORT`` asks for one (see :mod:`.metrics_server`); the only route returned is
``GET /debug/gc/state``, and only when ``DYN_DEBUG_GC_ENDPOINT`` asks for it.

Where the installed ai-dynamo freezes its frontend itself (:mod:`.stand_down`), the provider does
none of this: one line, no routes, no maintenance (upstream's freeze is the only one).

With ``--dyn-gc-maintenance idle`` / ``DYN_GC_MAINTENANCE=idle`` the frontend also runs the
serving-time maintenance (:mod:`.served_maintenance`): each request's way through the chat
processor's ``generator`` (``VllmProcessor``, ``SglangProcessor``) is counted in flight and
held while a maintenance runs, and the maintainer runs on upstream's event loop, which the
provider is called on. Upstream's default chat processor serves requests in Rust, where
nothing can count them: with it, maintenance on is an exit 2 here, before anything is
installed. The processors are built by the model watcher once HTTP is up, after this point,
so every one of them takes the gated method.
"""

from __future__ import annotations

import atexit
import logging
import sys
import threading
from dataclasses import dataclass

from dynamo_gc import lifecycle, startup_stop
from dynamo_gc.freeze import maybe_freeze_gc_heap
from dynamo_gc.gc_state import ProcessGcState
from dynamo_gc.metrics import DEBUG_GC_STATE_PATH, DynamoMetrics, debug_gc_state
from dynamo_gc.upstream import (
    frontend_hooks,
    frontend_settings,
    metrics_server,
    preprocess_pool,
    request_gate,
    served_maintenance,
    stand_down,
)
from dynamo_gc.upstream.frontend_settings import FrontendGcConfig
from dynamo_gc.upstream.request_gate import RequestPath

logger = logging.getLogger(__name__)

EXTENSION_NAME = "gc-freeze"
FREEZE_CONTEXT = "upstream frontend, before HTTP admits requests"
ADMISSION = "upstream frontend starts its HTTP service"


@dataclass(frozen=True)
class Activation:
    """What the extension did in this process (one per process)."""

    config: FrontendGcConfig
    frozen: int | None
    metrics: DynamoMetrics
    metrics_port: int | None
    process_state: ProcessGcState  # undone at interpreter exit
    gc: served_maintenance.AdapterGc | None = None  # the maintenance's parts, when on


_lock = threading.Lock()
_configured: FrontendGcConfig | None = None
_activation: Activation | None = None
# Upstream freezes this process itself (:mod:`.stand_down`): the provider does nothing more.
_stood_down = False


def configure(config: FrontendGcConfig) -> None:
    """Options from ``python -m dynamo_gc.frontend``'s flags, used instead of the env vars."""
    global _configured
    with _lock:
        _configured = config


def mark_stood_down() -> None:
    """The launcher found upstream's own freeze and said so: the provider, if upstream calls it
    too (the env var set as well), does nothing and logs nothing more."""
    global _stood_down
    with _lock:
        _stood_down = True


def not_served(config: FrontendGcConfig) -> list[str]:
    """The adapter's own settings in ``config`` that nothing serves once it stands down."""
    lost = []
    if config.metrics_port is not None:
        lost.append(f"--dyn-gc-metrics-port / DYN_GC_METRICS_PORT ({config.metrics_port})")
    if config.debug_gc_endpoint:
        lost.append("--dyn-debug-gc-endpoint / DYN_DEBUG_GC_ENDPOINT")
    if config.maintenance.enabled:
        mode = config.maintenance.mode
        lost.append(f"--dyn-gc-maintenance / DYN_GC_MAINTENANCE ({mode})")
    return lost


def activation() -> Activation | None:
    """This process's activation, or ``None`` before the provider ran."""
    return _activation


def gc_freeze_routes() -> list:
    """The ``gc-freeze`` provider: upstream calls it after ``make_engine``, before HTTP starts.

    A changed upstream and bad env values exit 2 here (``SystemExit``, which upstream's loader
    does not catch: it leaves ``async_main`` and the process with status 2), naming the symbol or
    the env var, before upstream opens its HTTP port and with nothing of the adapter installed.
    """
    global _activation, _stood_down
    # A stop signal recorded during start-up (see dynamo_gc.upstream.interrupts): HTTP never
    # starts. StartupInterrupted is a KeyboardInterrupt, which upstream's loader lets through.
    startup_stop.check()
    with _lock:
        if _stood_down:
            return []  # upstream freezes this process itself; the line was logged once
        if _activation is not None:
            # Both activation ways at once (the entry point and the launcher, or the entry-point
            # name and its module:function path): one freeze, one pause logger.
            logger.info("GC freeze extension already active in this process; nothing more to do")
            return []
        if _configured is not None:
            config = _configured  # the launcher's flags; it checked upstream before starting it
            program = frontend_settings.PROGRAM  # what the operator ran
        else:
            program = frontend_hooks.EXTENSION_PROGRAM
            # Upstream's own command (the Kubernetes way): nothing has checked upstream yet.
            upstream = frontend_hooks.checked_frontend_main(frontend_hooks.EXTENSION_PROGRAM)
            config = frontend_settings.from_env()
            own_freeze = stand_down.upstream_freeze_in(upstream)
            if own_freeze is not None:
                stand_down.stand_down(
                    frontend_hooks.EXTENSION_PROGRAM, own_freeze, not_served(config)
                )
                _stood_down = True
                return []
        _activation = _activate(config, program)
    return debug_routes() if config.debug_gc_endpoint else []


def debug_routes() -> list:
    """``GET /debug/gc/state`` as an upstream ``FrontendRoute`` (JSON, walks the heap)."""
    from dynamo.llm import FrontendRoute  # upstream's; only ever called in its frontend

    def state(_context: object) -> dict:
        return debug_gc_state()

    logger.warning(
        "Debug endpoint enabled: GET %s walks the heap to count its objects", DEBUG_GC_STATE_PATH
    )
    return [FrontendRoute("GET", DEBUG_GC_STATE_PATH, state)]


# Where each request of a chat processor passes through Python (upstream's default processor
# has none: it serves in Rust).
REQUEST_PATHS = {
    "vllm": (RequestPath("dynamo.frontend.vllm_processor", "VllmProcessor", "generator"),),
    "sglang": (RequestPath("dynamo.frontend.sglang_processor", "SglangProcessor", "generator"),),
}


def maintained_paths(
    config: FrontendGcConfig, program: str, upstream_args: list[str]
) -> tuple[RequestPath, ...]:
    """The request paths the maintenance gates; exit 2 when the processor has none (called by
    the launcher before upstream starts too, so that refusal comes before the engine is built)."""
    if not config.maintenance.enabled:
        return ()
    processor = frontend_hooks.chat_processor(upstream_args, program)
    paths = REQUEST_PATHS.get(processor)
    if paths is None:
        mode = config.maintenance.mode
        print(
            f"{program}: error: --dyn-gc-maintenance {mode} / DYN_GC_MAINTENANCE={mode} needs "
            f"--dyn-chat-processor vllm or sglang: with the {processor!r} processor upstream's "
            "frontend serves requests in Rust, where the adapter cannot count them in flight",
            file=sys.stderr,
            flush=True,
        )
        raise SystemExit(2)
    return paths


def _activate(config: FrontendGcConfig, program: str) -> Activation:
    settings = config.gc
    # First, so that a pool the adapter cannot find is an exit 2 with nothing installed. sys.argv
    # is upstream's command line here, in both activation ways (upstream's parse_args reads it,
    # and the launcher hands upstream its arguments through it).
    requested = frontend_hooks.preprocess_pool_requested(sys.argv[1:], program)
    paths = maintained_paths(config, program, sys.argv[1:])
    preprocess_pool.wrap_initializer(settings, requested_workers=requested)
    adapter_gc = served_maintenance.observe(
        program,
        settings,
        config.maintenance,
        paths=paths,
        context="upstream frontend",
    )
    metrics = adapter_gc.metrics
    metrics_port = None
    if config.metrics_port is not None:
        metrics_port = metrics_server.serve(metrics, config.metrics_host, config.metrics_port)
    frozen = maybe_freeze_gc_heap(settings.freeze_gc_heap, context=FREEZE_CONTEXT)
    process_state = ProcessGcState(metrics)
    process_state.froze = frozen is not None
    try:
        startup_stop.check()  # a signal during the freeze's collection
    except startup_stop.StartupInterrupted:
        process_state.restore()  # a stop leaves the GC state as it was
        raise
    adapter_gc.frozen(frozen)
    lifecycle.mark_serving(ADMISSION)
    adapter_gc.serve()  # the maintainer, on upstream's loop (the provider is called on it)
    # Upstream's main owns shutdown; at interpreter exit (after it returns) the heap is unfrozen,
    # so the final collections can finalize what the freeze kept (vLLM's native objects would
    # otherwise be reported as leaked), and the pause logger leaves before the last lines.
    atexit.register(process_state.restore)
    return Activation(config, frozen, metrics, metrics_port, process_state, adapter_gc)


def reset_for_tests() -> None:
    """Forget this process's activation and configured settings (tests run many in one process)."""
    global _activation, _configured, _stood_down
    with _lock:
        if _activation is not None:
            atexit.unregister(_activation.process_state.restore)
            _activation.metrics.detach()
            maintainer = None if _activation.gc is None else _activation.gc.maintainer
            if maintainer is not None:
                maintainer.cancel()  # its loop is the test's, which ends with the test
        _activation = None
        _configured = None
        _stood_down = False
    preprocess_pool.unwrap_initializer()
    for paths in REQUEST_PATHS.values():
        request_gate.ungate(paths)
    metrics_server.stop()
