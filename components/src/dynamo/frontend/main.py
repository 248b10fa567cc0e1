"""``python -m dynamo.frontend``: the OpenAI-compatible frontend, freezing at its quiescent point.

Start-up order (each step logged), which is the point of this launcher:

1. parse args (bad input exits 2 before anything runs), logging, the GC pause logger;
2. build everything that does not depend on discovery: preprocess worker processes (each freezes
   its own heap in its initializer), the worker client session, the model registry, the app and
   its routes;
3. freeze the GC heap (``maybe_freeze_gc_heap(..., context="frontend")``);
4. mark the process ``serving``: from here on any freeze is refused;
5. open the HTTP listener;
6. start the discovery watcher. Models found from now on grow the heap after the freeze; the
   watcher and the chat engine factory never freeze (and the guard would refuse if they did).

SIGTERM/SIGINT: mark ``draining``, stop the watcher, stop accepting, let in-flight requests
finish (bounded), stop the preprocess pool, exit 0.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
from dataclasses import dataclass
from typing import Sequence

import aiohttp
from aiohttp import web

from dynamo.common import lifecycle
from dynamo.common.metrics import DynamoMetrics, debug_gc_route, metrics_route
from dynamo.common.utils import gc_freeze
from dynamo.runtime.discovery import DiscoveryWatcher

from . import frontend_args, gc_collect_trace
from .chat_processor import build_chat_processor
from .http_service import FrontendService
from dynamo.common.logging_setup import configure_logging
from .model_registry import ModelRegistry
from .preprocess_pool import PreprocessPool, PreprocessPoolError
from .worker_router import WorkerRouter, create_worker_session

logger = logging.getLogger(__name__)

FREEZE_CONTEXT = "frontend"
# How long in-flight requests may take to finish after SIGTERM before they are cancelled.
DRAIN_TIMEOUT_S = 30.0


@dataclass
class Frontend:
    """The parts built before the freeze (none of them depends on discovery)."""

    config: argparse.Namespace
    registry: ModelRegistry
    service: FrontendService
    session: aiohttp.ClientSession
    app: web.Application
    runner: web.AppRunner
    watcher: DiscoveryWatcher
    preprocess_pool: PreprocessPool | None

    async def close(self) -> None:
        await self.watcher.stop()
        await self.runner.cleanup()  # idempotent: no-op when already cleaned up
        await self.session.close()
        if self.preprocess_pool is not None:
            self.preprocess_pool.shutdown()


async def build_frontend(
    config: argparse.Namespace, metrics: DynamoMetrics | None = None
) -> Frontend:
    pool = None
    if config.dyn_preprocess_workers > 0:
        pool = PreprocessPool(
            config.dyn_preprocess_workers,
            freeze_gc_heap=config.freeze_gc_heap,
            gc_pause_log_ms=config.gc_pause_log_ms,
            log_level=logging.getLogger().level,
        )
        # Blocking on purpose: nothing is served yet, and every worker must have frozen its
        # heap before this process freezes and admits requests.
        pool.start()
    session = create_worker_session()
    registry = ModelRegistry(build_chat_processor)
    service = FrontendService(registry, WorkerRouter(session), pool)
    app = service.build_app()
    if metrics is not None:
        metrics_route(app, metrics)  # GET /metrics on the HTTP port
    if config.debug_gc_endpoint:
        debug_gc_route(app)  # POST /debug/gc/collect: off unless the operator asks
    runner = web.AppRunner(
        app,
        handler_cancellation=True,  # a client that hangs up aborts its request in the worker
        shutdown_timeout=DRAIN_TIMEOUT_S,
        access_log=None,
    )
    await runner.setup()  # builds the server object; the socket opens in TCPSite.start
    watcher = DiscoveryWatcher(
        config.discovery_dir,
        on_add=registry.add_instance,
        on_remove=registry.remove_instance,
        ttl_s=config.discovery_ttl,  # a worker whose record stops changing is dropped
    )
    return Frontend(config, registry, service, session, app, runner, watcher, pool)


def _url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


async def serve(config: argparse.Namespace, metrics: DynamoMetrics | None = None) -> int:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()

    def request_stop(signum: int) -> None:
        if not stop.is_set():
            logger.info("Received %s: draining", signal.Signals(signum).name)
        stop.set()

    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, request_stop, signum)
    frontend = None
    try:
        try:
            frontend = await build_frontend(config, metrics)
        except PreprocessPoolError as exc:
            logger.error("Frontend start-up failed: %s", exc)
            return 1
        if stop.is_set():
            return 0  # stopped during start-up: never admitted anything

        # The quiescent point: everything static is built, nothing is admitted yet.
        gc_freeze.maybe_freeze_gc_heap(config.freeze_gc_heap, context=FREEZE_CONTEXT)
        lifecycle.mark_serving("http listener")
        site = web.TCPSite(frontend.runner, config.http_host, config.http_port)
        try:
            await site.start()
        except OSError as exc:
            logger.error(
                "Cannot listen on %s: %s", _url(config.http_host, config.http_port), exc
            )
            return 1
        host, port = frontend.runner.addresses[0][:2]
        logger.info("HTTP service listening on %s", _url(host, port))

        frontend.watcher.start()
        logger.info(
            "Discovery watcher started: %s (ttl %g s)", config.discovery_dir, config.discovery_ttl
        )

        await stop.wait()
        lifecycle.mark_draining("signal")
        logger.info(
            "Draining: %d request(s) in flight; waiting up to %.0f s for them",
            frontend.service.in_flight,
            DRAIN_TIMEOUT_S,
        )
        await frontend.watcher.stop()
        # Closes the listener, waits up to DRAIN_TIMEOUT_S for in-flight handlers, then cancels.
        await frontend.runner.cleanup()
        logger.info("HTTP service stopped")
        return 0
    finally:
        if frontend is not None:
            await frontend.close()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)


def main(argv: Sequence[str] | None = None) -> int:
    config = frontend_args.parse_args(argv)  # exits 2 on bad input, before anything runs
    configure_logging()
    gc_collect_trace.install_if_requested()
    metrics = DynamoMetrics(freeze_enabled=config.freeze_gc_heap).attach()
    # Always installed: every pause feeds dynamo_gc_pause_seconds, even with the log off (0).
    gc_freeze.install_gc_pause_logger(config.gc_pause_log_ms, on_pause=metrics.observe_pause)
    logger.info(
        "Frontend starting: http=%s discovery_dir=%s preprocess_workers=%d freeze_gc_heap=%s",
        _url(config.http_host, config.http_port),
        config.discovery_dir,
        config.dyn_preprocess_workers,
        "on" if config.freeze_gc_heap else "off",
    )
    code = asyncio.run(serve(config, metrics))
    logger.info("Frontend exiting with code %d", code)
    return code
