"""The frontend process's parts, built at start-up and run through the launcher's lifecycle.

:class:`FrontendProcess` is the frontend's :class:`~dynamo.common.launcher.Service`:

* ``start``: everything that does not depend on discovery: the preprocess pool (each of its
  processes freezes its own heap in its initializer, so the pool is started, and waited for,
  before this process freezes), the worker client session, the model registry, the app and its
  routes, and the HTTP listener's sockets, bound but not listening: a taken port or a host that
  is no address of this machine fails here, before the freeze;
* ``admit`` (after the freeze, the phase ``serving``): the listener listens, and the discovery
  watcher starts. Models found from now on grow the heap after the freeze; the watcher and the
  chat engine factory never freeze (the guard would refuse if they did); each model's processor
  is built in a thread, so serving never waits for it;
* ``serve``: until SIGTERM/SIGINT; then one drain deadline (``--dyn-drain-timeout``) starts and
  the phase becomes ``draining``. Closing (the launcher's) stops the watcher, closes the listener
  (new connections are refused from here on: in Kubernetes a preStop hook keeps the pod serving
  until its endpoints are gone, see docs/deploy/), lets in-flight requests finish until the
  deadline, cuts the rest short (a stream ends with an SSE error event and ``[DONE]``, see
  :mod:`dynamo.frontend.serving.stream_drain`), then stops the preprocess pool and the client
  session.

With ``--dyn-gc-maintenance idle`` the OpenAI API requests (``/v1/...``) go through an admission
gate, the maintainer starts with the listener and is stopped when the signal comes, before the
drain. It maintains this process only: the preprocess pool's workers and the template render
processes are processes of their own (each frozen at its start), which it does not reach.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import socket

from aiohttp import web
from prometheus_client import Gauge

from dynamo.common import logging_setup
from dynamo.common.admission_routes import install_admission_gate
from dynamo.common.http_server import GuardedRunner
from dynamo.common.launcher import Closer, OptionUnusable, StartupFailed, StopSignals
from dynamo.common.listener_socket import bound_sockets
from dynamo.common.metrics_routes import debug_gc_route, metrics_route
from dynamo.common.request_drain import END_BOUND_S
from dynamo.frontend.processors.chat_processor import build_chat_processor
from dynamo.frontend.processors.preprocess_pool import PreprocessPool, PreprocessPoolError
from dynamo.frontend.processors.sglang_processor import SglangSettings
from dynamo.frontend.processors.template_sandbox import TemplateSandbox
from dynamo.frontend.routing.model_registry import ModelRegistry
from dynamo.frontend.routing.worker_router import WorkerRouter, create_worker_session
from dynamo.frontend.serving.http_service import FrontendService
from dynamo.frontend.serving.http_surface import http_runner
from dynamo.frontend.serving.request_metrics import RequestMetrics
from dynamo.frontend.serving.stream_drain import frontend_drain
from dynamo.runtime.discovery import STATE_DEGRADED, Discovery, RecordWatcher
from dynamo_gc import lifecycle, startup_stop
from dynamo_gc.admission import AdmissionGate
from dynamo_gc.maintainer import GcMaintainer
from dynamo_gc.metrics import DynamoMetrics
from dynamo_gc.process_gc import GcMaintenance

from . import frontend_args
from .frontend_args import FrontendConfig

logger = logging.getLogger(__name__)

DISCOVERY_DEGRADED_METRIC = "dynamo_discovery_degraded"
API_PREFIX = "/v1/"  # the OpenAI API: what a maintenance's admission gate counts and holds


class FrontendProcess:
    freeze_context = "frontend"
    admission = "http listener"

    def __init__(
        self,
        config: FrontendConfig,
        discovery: Discovery,
        metrics: DynamoMetrics | None = None,
        sglang: SglangSettings | None = None,
        maintenance: GcMaintenance | None = None,
    ) -> None:
        self.config = config
        self.discovery = discovery
        self.metrics = metrics
        self.sglang = sglang
        self.maintenance = maintenance
        self.gate = AdmissionGate() if maintenance is not None else None
        self.maintainer: GcMaintainer | None = None
        self.drain = frontend_drain()
        self.service: FrontendService | None = None
        self.watcher: RecordWatcher | None = None
        self.runner: GuardedRunner | None = None
        self._sockets: list[socket.socket] = []

    async def start(self, closer: Closer) -> None:
        config = self.config
        pool = None
        if config.dyn_preprocess_workers > 0:
            pool = PreprocessPool(
                config.dyn_preprocess_workers,
                freeze_gc_heap=config.freeze_gc_heap,
                gc_pause_log_ms=config.gc_pause_log_ms,
                log_level=logging_setup.current_log_levels(),  # DYN_LOG's levels, targets too
                chat_processor=config.dyn_chat_processor,
            )
            closer.push("preprocess pool", pool.aclose)
            try:
                # Blocking on purpose: nothing is served yet, and every worker must have frozen
                # its heap before this process freezes and admits requests.
                pool.start()
            except PreprocessPoolError as exc:
                raise StartupFailed(f"Frontend start-up failed: {exc}") from None
            startup_stop.check()  # the pool's start blocks: a signal meanwhile stops here
        sandbox = None
        if config.dyn_template_processes > 0:  # every processor's templates: docs/security.md
            sandbox = TemplateSandbox(
                config.dyn_template_processes,
                timeout_s=config.dyn_template_timeout,
                memory_mb=config.dyn_template_memory_mb,
            )
            closer.push("template render processes", sandbox.aclose)
            try:
                await asyncio.to_thread(sandbox.start)
            except RuntimeError as exc:
                raise StartupFailed(f"Frontend start-up failed: {exc}") from None
            startup_stop.check()
            logger.info(
                "Template render processes ready: processes=%d pids=%s timeout_s=%g "
                "memory_mb=%d per_model=%d",
                sandbox.processes,
                sandbox.pids(),
                sandbox.timeout_s,
                config.dyn_template_memory_mb,
                sandbox.per_model,
            )
        session = create_worker_session()
        closer.push("worker client session", session.close)
        registry = ModelRegistry(
            functools.partial(
                build_chat_processor,
                kind=config.dyn_chat_processor,
                sglang=self.sglang,
                model_dirs=config.dyn_model_dirs or (),
                # A peer's template compiles in a bounded process before its model is served.
                template_check=None if sandbox is None else sandbox.check_compiles,
            ),
            max_models=config.dyn_max_models,
        )
        closer.push("chat processor builds", registry.aclose)
        # dynamo_frontend_* (upstream's request metrics) next to the GC metrics on /metrics
        # Labels follow what is served: a served model's series stay, long-gone ones go.
        request_metrics = (
            None
            if self.metrics is None
            else RequestMetrics(
                self.metrics.registry, is_served=lambda name: registry.get(name) is not None
            )
        )
        router = WorkerRouter(session)
        closer.push("worker router", router.aclose)
        service = self.service = FrontendService(
            registry,
            router,
            pool,
            request_metrics,
            template_sandbox=sandbox,
            ready_min_models=config.dyn_ready_min_models,
            strict_request_fields=config.dyn_strict_request_fields,
        )
        closer.push("preprocessing threads", service.close)
        app = service.build_app()
        if self.metrics is not None:
            metrics_route(app, self.metrics)  # GET /metrics on the HTTP port
        if config.debug_gc_endpoint:
            debug_gc_route(app)  # POST /debug/gc/collect: off unless the operator asks
        self.drain.install(app)
        if self.gate is not None:  # the OpenAI API only: probes and /metrics answer regardless
            install_admission_gate(
                app, self.gate, gated=lambda request: request.path.startswith(API_PREFIX)
            )
        self.runner = http_runner(
            app,
            handler_cancellation=True,  # a client that hangs up aborts its request in the worker
            # Our drain has finished every request by the time aiohttp's cleanup runs: this only
            # bounds closing the connections left (aiohttp waits up to twice this long).
            shutdown_timeout=END_BOUND_S / 2,
        )
        await self.runner.setup()
        closer.push("HTTP service", self._stop_http_service)
        self._sockets = self._bind()
        # file: a worker whose record stops changing for --discovery-ttl is dropped
        watcher = self.discovery.watcher(
            on_add=registry.add_instance, on_remove=registry.remove_instance
        )
        self.watcher = watcher
        closer.push("discovery watcher", watcher.stop)
        service.probes.discovery_watcher = watcher  # /health reports its state, waits for its list
        if self.metrics is not None:
            discovery_degraded_gauge(self.metrics, watcher)

    def _bind(self) -> list[socket.socket]:
        """The listener's sockets, bound now (a bad host or port fails before the freeze) and
        listening only once the process admits requests."""
        config = self.config
        try:
            return bound_sockets(config.http_host, config.http_port)
        except OSError as exc:
            option = frontend_args.listen_option_at_fault(exc)
            raise OptionUnusable(
                f"Cannot listen on {config.url} ({exc.strerror or exc}): choose another "
                f"{option.source_label()}"
            ) from None

    async def admit(self) -> None:
        assert self.runner is not None and self.watcher is not None, "start() has run"
        for sock in self._sockets:
            # Right before the socket listens (no await in between): a signal recorded by now
            # stops start-up, whether or not its cancellation reached this task.
            startup_stop.check()
            await web.SockSite(self.runner, sock).start()
        host, port = self.runner.addresses[0][:2]
        url = f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
        logger.info("HTTP service listening on %s", url)
        self.watcher.start()
        logger.info(
            "Discovery watcher started: %s (ttl %g s)",
            self.discovery.describe(),
            self.config.discovery_ttl,
        )
        if self.maintenance is not None and self.gate is not None:
            self.maintainer = self.maintenance.maintainer(
                self.maintenance.idle_quiescence(self.gate),
                context=self.freeze_context,
                pause_log_ms=self.config.gc_pause_log_ms,
            )
            self.maintainer.start()

    async def serve(self, signals: StopSignals) -> int:
        await signals.wait()
        if self.maintainer is not None:
            await self.maintainer.stop()  # first: no maintenance once serving ends
        self.drain.start(self.config.drain_timeout)  # one deadline, from the signal, for it all
        lifecycle.mark_draining("signal")
        logger.info(
            "Draining: %d request(s) in flight; waiting up to %.0f s for them",
            self.service.in_flight if self.service is not None else 0,
            self.config.drain_timeout,
        )
        return 0

    async def _stop_http_service(self) -> None:
        runner = self.runner
        assert runner is not None
        for site in list(runner.sites):
            await site.stop()  # the listener closes: new connections are refused from here on
        for sock in self._sockets:
            sock.close()  # bound but never listening: start-up ended before admission
        finished, cut = await self.drain.wait()  # until the deadline set when the drain began
        if finished or cut:
            logger.info(
                "Drain done: %d request(s) finished, %d cut short at the deadline", finished, cut
            )
        await runner.cleanup()
        logger.info("HTTP service stopped")


def discovery_degraded_gauge(metrics: DynamoMetrics, watcher: RecordWatcher) -> None:
    """1 while the watcher is cut off from its store (it routes to what it knew), else 0."""
    gauge = Gauge(
        DISCOVERY_DEGRADED_METRIC,
        "1 while model discovery cannot reach its store (the frontend keeps routing to the "
        "instances it knew), 0 otherwise",
        registry=metrics.registry,
    )
    gauge.set_function(lambda: 1.0 if watcher.state == STATE_DEGRADED else 0.0)
