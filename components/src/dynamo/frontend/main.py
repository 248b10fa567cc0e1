"""``python -m dynamo.frontend``: the OpenAI-compatible frontend, freezing at its quiescent point.

Start-up order (each step logged), which is the point of this launcher:

1. parse args and check that the discovery directory can be watched (created if missing): bad
   input exits 2 before anything runs; then logging and the GC pause logger;
2. import the chat processor's libraries (``--dyn-chat-processor vllm`` or ``sglang``:
   vLLM's or SGLang's, whose heap is what the freeze is for; sglang's options are checked
   against SGLang's registries once it is imported); build everything that does not depend
   on discovery: preprocess worker processes (each freezes its own heap in its initializer),
   the worker client session, the model registry, the app and its routes;
3. freeze the GC heap (``maybe_freeze_gc_heap(..., context="frontend")``);
4. mark the process ``serving``: from here on any freeze is refused;
5. open the HTTP listener;
6. start the discovery watcher. Models found from now on grow the heap after the freeze; the
   watcher and the chat engine factory never freeze (and the guard would refuse if they did);
   each model's processor is built in a thread, so serving never waits for it.

SIGTERM/SIGINT: mark ``draining``, stop the watcher, close the listener (new connections are
refused from here on: in Kubernetes a preStop hook keeps the pod serving until its endpoints are
gone, see docs/deploy/), let in-flight requests finish until one deadline (``--dyn-drain-timeout``
after the signal), cut the rest short (a stream ends with an SSE error event and ``[DONE]``, see
:mod:`dynamo.frontend.stream_drain`), stop the preprocess pool and the client session, then put
the process's GC state back (pause logger, metrics, unfreeze) and exit 0. Each part is closed
even if closing another one failed (exit 1 then).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import logging
import signal
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

import aiohttp
from aiohttp import web
from prometheus_client import Gauge

from dynamo.common import lifecycle, logging_setup
from dynamo.common.configuration import upstream
from dynamo.common.configuration.drain_options import DEFAULT_DRAIN_TIMEOUT_S
from dynamo.common.configuration.runtime_options import DISCOVERY_DIR, discovery_settings
from dynamo.common.http_server import GuardedRunner
from dynamo.common.metrics import DynamoMetrics, debug_gc_route, metrics_route
from dynamo.common.request_drain import END_BOUND_S, RequestDrain
from dynamo.common.utils import gc_freeze
from dynamo.runtime.discovery import (
    STATE_DEGRADED,
    Discovery,
    DiscoveryDirError,
    DiscoverySetupError,
    RecordWatcher,
    open_discovery,
)

from . import frontend_args, sglang_options
from .chat_processor import build_chat_processor, import_processor_libraries
from .http_service import FrontendService
from .model_registry import ModelRegistry
from .preprocess_pool import PreprocessPool, PreprocessPoolError
from .sglang_processor import SETUP_COMMAND as SGLANG_SETUP_COMMAND
from .stream_drain import frontend_drain
from .worker_router import WorkerRouter, create_worker_session

logger = logging.getLogger(__name__)

PROG = "python -m dynamo.frontend"
FREEZE_CONTEXT = "frontend"
# How long in-flight requests may take to finish after SIGTERM (the --dyn-drain-timeout default).
DRAIN_TIMEOUT_S = DEFAULT_DRAIN_TIMEOUT_S


class Closer:
    """Closes what was opened, last opened first, every part even if another one fails.

    A failure is logged with its traceback and remembered (the exit code becomes 1); the parts
    after it are still closed, so one broken part never leaves a listener, a client session or
    preprocess processes behind.
    """

    def __init__(self) -> None:
        self._stack = contextlib.AsyncExitStack()
        self.failed: list[str] = []

    def push(self, what: str, close: Callable[[], Awaitable[None] | None]) -> None:
        async def guarded() -> None:
            try:
                result = close()
                if asyncio.iscoroutine(result):
                    await result
            except Exception:  # see the class docstring
                self.failed.append(what)
                logger.exception("Shutdown: closing the %s failed", what)

        self._stack.push_async_callback(guarded)

    async def aclose(self) -> None:
        await self._stack.aclose()


@dataclass
class Frontend:
    """The parts built before the freeze (none of them depends on discovery)."""

    config: argparse.Namespace
    registry: ModelRegistry
    service: FrontendService
    session: aiohttp.ClientSession
    app: web.Application
    runner: web.AppRunner
    watcher: RecordWatcher
    preprocess_pool: PreprocessPool | None
    drain: RequestDrain
    closer: Closer = field(default_factory=Closer)

    async def close(self) -> None:
        """Watcher, listener and drain, session, pool: each one, always; idempotent."""
        await self.closer.aclose()


async def build_frontend(
    config: argparse.Namespace, metrics: DynamoMetrics | None = None
) -> Frontend:
    closer = Closer()
    try:
        return await _build(config, metrics, closer)
    except BaseException:
        await closer.aclose()  # a start-up that fails half-way closes what it had opened
        raise


async def _build(
    config: argparse.Namespace, metrics: DynamoMetrics | None, closer: Closer
) -> Frontend:
    pool = None
    if config.dyn_preprocess_workers > 0:
        pool = PreprocessPool(
            config.dyn_preprocess_workers,
            freeze_gc_heap=config.freeze_gc_heap,
            gc_pause_log_ms=config.gc_pause_log_ms,
            log_level=logging_setup.current_log_levels(),  # DYN_LOG's levels, targets too
            chat_processor=config.dyn_chat_processor,
        )
        # Blocking on purpose: nothing is served yet, and every worker must have frozen its
        # heap before this process freezes and admits requests.
        pool.start()
        closer.push("preprocess pool", pool.aclose)
    session = create_worker_session()
    closer.push("worker client session", session.close)
    registry = ModelRegistry(
        functools.partial(
            build_chat_processor,
            kind=config.dyn_chat_processor,
            sglang=getattr(config, "sglang_settings", None),  # set by main() in sglang mode
        ),
        max_models=config.dyn_max_models,
    )
    closer.push("chat processor builds", registry.aclose)
    service = FrontendService(registry, WorkerRouter(session), pool)
    app = service.build_app()
    if metrics is not None:
        metrics_route(app, metrics)  # GET /metrics on the HTTP port
    if config.debug_gc_endpoint:
        debug_gc_route(app)  # POST /debug/gc/collect: off unless the operator asks
    drain = frontend_drain()
    drain.install(app)
    runner = GuardedRunner(
        app,
        what="HTTP service",
        handler_cancellation=True,  # a client that hangs up aborts its request in the worker
        # Our drain has finished every request by the time aiohttp's cleanup runs: this only
        # bounds closing the connections left (aiohttp waits up to twice this long).
        shutdown_timeout=END_BOUND_S / 2,
    )
    await runner.setup()  # builds the server object; the socket opens in TCPSite.start

    async def stop_http_service() -> None:
        for site in list(runner.sites):
            await site.stop()  # the listener closes: new connections are refused from here on
        finished, cut = await drain.wait()  # until the deadline set when the drain began
        if finished or cut:
            logger.info(
                "Drain done: %d request(s) finished, %d cut short at the deadline", finished, cut
            )
        await runner.cleanup()
        logger.info("HTTP service stopped")

    closer.push("HTTP service", stop_http_service)
    discovery: Discovery = getattr(config, "discovery", None) or open_discovery(
        discovery_settings(config)
    )
    # file: a worker whose record stops changing for --discovery-ttl is dropped
    watcher = discovery.watcher(on_add=registry.add_instance, on_remove=registry.remove_instance)
    closer.push("discovery watcher", watcher.stop)
    service.discovery_watcher = watcher  # /health reports its state (and waits for its first list)
    if metrics is not None:
        discovery_degraded_gauge(metrics, watcher)
    return Frontend(config, registry, service, session, app, runner, watcher, pool, drain, closer)


DISCOVERY_DEGRADED_METRIC = "dynamo_discovery_degraded"


def discovery_degraded_gauge(metrics: DynamoMetrics, watcher: RecordWatcher) -> None:
    """1 while the watcher is cut off from its store (it routes to what it knew), else 0."""
    gauge = Gauge(
        DISCOVERY_DEGRADED_METRIC,
        "1 while model discovery cannot reach its store (the frontend keeps routing to the "
        "instances it knew), 0 otherwise",
        registry=metrics.registry,
    )
    gauge.set_function(lambda: 1.0 if watcher.state == STATE_DEGRADED else 0.0)


def _url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


async def serve(
    config: argparse.Namespace,
    metrics: DynamoMetrics | None = None,
    gc_state: gc_freeze.ProcessGcState | None = None,
) -> int:
    """Start, serve until SIGTERM/SIGINT, drain, close; the exit code (0, or 1 on a failure)."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()

    def request_stop(signum: int) -> None:
        if not stop.is_set():
            logger.info("Received %s: draining", signal.Signals(signum).name)
        stop.set()

    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, request_stop, signum)
    built: list[Frontend] = []
    close_failed = False
    try:
        code = await _run(config, metrics, gc_state or gc_freeze.ProcessGcState(), stop, built)
    finally:
        for frontend in built:
            await frontend.close()
            close_failed = bool(frontend.closer.failed)
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)
    return 1 if close_failed else code


async def _run(
    config: argparse.Namespace,
    metrics: DynamoMetrics | None,
    gc_state: gc_freeze.ProcessGcState,
    stop: asyncio.Event,
    built: list[Frontend],
) -> int:
    try:
        frontend = await build_frontend(config, metrics)
    except PreprocessPoolError as exc:
        logger.error("Frontend start-up failed: %s", exc)
        return 1
    built.append(frontend)
    if stop.is_set():
        return 0  # stopped during start-up: never admitted anything

    # The quiescent point: everything static is built, nothing is admitted yet.
    froze = gc_freeze.maybe_freeze_gc_heap(config.freeze_gc_heap, context=FREEZE_CONTEXT)
    gc_state.froze = froze is not None
    lifecycle.mark_serving("http listener")
    site = web.TCPSite(frontend.runner, config.http_host, config.http_port)
    try:
        await site.start()
    except OSError as exc:
        logger.error(
            "Cannot listen on %s (%s): choose another %s",
            _url(config.http_host, config.http_port),
            exc.strerror or exc,
            frontend_args.listen_option_at_fault(exc).source_label(),
        )
        return 1
    host, port = frontend.runner.addresses[0][:2]
    logger.info("HTTP service listening on %s", _url(host, port))

    frontend.watcher.start()
    logger.info(
        "Discovery watcher started: %s (ttl %g s)",
        config.discovery.describe()
        if hasattr(config, "discovery")
        else discovery_settings(config).directory,
        config.discovery_ttl,
    )

    await stop.wait()
    frontend.drain.start(config.drain_timeout)  # one deadline, from the signal, for it all
    lifecycle.mark_draining("signal")
    logger.info(
        "Draining: %d request(s) in flight; waiting up to %.0f s for them",
        frontend.service.in_flight,
        config.drain_timeout,
    )
    # Stops the watcher, closes the listener (new connections are refused from now on), waits
    # for in-flight requests until the deadline then cuts the rest short, each with an ending,
    # closes the session and the pool: each part even if another fails (serve() turns a
    # failure into exit code 1).
    await frontend.close()
    return 0


def check_discovery(discovery: Discovery, directory: str) -> str | None:
    """Why the discovery store cannot be watched (a directory is created when missing), or None."""
    try:
        discovery.check(writer=False)
    except DiscoveryDirError as exc:
        return (
            f"{DISCOVERY_DIR.source_label()} is {directory!r}: the frontend cannot watch it ({exc})"
        )
    return None


def import_chat_processor(kind: str) -> str | None:
    """Import the chat processor's libraries now, before the freeze; why not, or None.

    With ``vllm`` that is vLLM's ~0.5M-object import heap: imported on the first discovered
    model instead, it would land after the freeze, where every full collection walks it.
    """
    started = time.perf_counter()
    try:
        libraries = import_processor_libraries(kind)
    except ImportError as exc:
        option = frontend_args.CHAT_PROCESSOR
        if kind == "sglang":
            return (
                f"{option.source_label()} is 'sglang' but SGLang cannot be imported in this "
                f"Python environment ({sys.executable}): {exc}. Create its environment with "
                f"{SGLANG_SETUP_COMMAND} and start the frontend with its python "
                "(.venv-sglang/bin/python -m dynamo.frontend), or use the default `hf`"
            )
        return (
            f"{option.source_label()} is {kind!r} but vLLM cannot be imported in this Python "
            f"environment ({sys.executable}): {exc}. Install vLLM next to the frontend (pip "
            "install vllm, or run it from the vLLM environment), or use the default `hf`"
        )
    logger.info(
        "Chat processor %s: imported %s in %.1f s",
        kind,
        libraries,
        time.perf_counter() - started,
    )
    return None


def main(argv: Sequence[str] | None = None) -> int:
    """Exit codes: 0 after a signal (or --help), 2 for bad input (a flag, an env var, an
    unusable discovery directory) before anything runs, 1 when start-up or shutdown fails."""
    try:
        config = frontend_args.parse_args(argv)
        log_levels = logging_setup.log_levels_or_exit(PROG)  # DYN_LOG, as upstream
    except SystemExit as exc:  # bad input (2, the parser printed why) or --help (0)
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
    settings = discovery_settings(config)
    try:
        # The etcd client is imported here, before the start-up freeze covers it.
        config.discovery = open_discovery(settings)
        problem = check_discovery(config.discovery, settings.directory)
    except DiscoverySetupError as exc:  # etcd credentials that cannot work
        problem = str(exc)
    if problem is None:
        problem = sglang_options.problem_before_import(config, frontend_args.CHAT_PROCESSOR)
    if problem is not None:
        # Before anything runs: a watcher on a file or an unreadable directory would see no
        # worker, ever, while /health said ready.
        print(f"{PROG}: error: {problem}", file=sys.stderr)
        return 2
    logging_setup.configure_logging(log_levels)
    logging_setup.warn_unmatched_targets(log_levels)
    upstream.warn_ignored_env(PROG, upstream.declared_names(frontend_args.SURFACE.options))
    problem = import_chat_processor(config.dyn_chat_processor)
    if problem is None and config.dyn_chat_processor == "sglang":
        # SGLang's registries are the source of its parser names: checked now it is imported.
        config.sglang_settings, problem = sglang_options.settings_or_problem(config)
    if problem is not None:
        print(f"{PROG}: error: {problem}", file=sys.stderr)
        return 2
    metrics = DynamoMetrics(freeze_enabled=config.freeze_gc_heap).attach()
    gc_state = gc_freeze.ProcessGcState(metrics)
    # Always installed: every pause feeds dynamo_gc_pause_seconds, even with the log off (0).
    gc_freeze.install_gc_pause_logger(config.gc_pause_log_ms, on_pause=metrics.observe_pause)
    logger.info(
        "Frontend starting: http=%s discovery=%s chat_processor=%s max_models=%d "
        "preprocess_workers=%d freeze_gc_heap=%s",
        _url(config.http_host, config.http_port),
        config.discovery.describe(),
        config.dyn_chat_processor,
        config.dyn_max_models,
        config.dyn_preprocess_workers,
        "on" if config.freeze_gc_heap else "off",
    )
    try:
        code = asyncio.run(serve(config, metrics, gc_state))
    finally:
        gc_state.restore()
    logger.info("Frontend exiting with code %d", code)
    return code
