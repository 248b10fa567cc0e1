"""The worker's system port: ``GET /live``, ``GET /health`` and ``GET /metrics`` (and, opt-in, a
debug GC route).

A worker has no HTTP service of its own (the frontend talks to it over the request plane), so
operators and Kubernetes probes reach it here. It runs in the worker's event loop and is started
early, before engine init, so a readiness probe sees ``starting`` (503) rather than a refused
connection, then ``serving`` (200) once the model is registered, then ``draining`` (503). A 503's
body says why in ``reason``.

``/live`` is liveness, as upstream Dynamo's system server has it: 200 whenever the process can
answer, whatever the phase. A liveness probe on ``/health`` would restart a worker whose engine
init (or self-benchmark) takes longer than the probe's patience; on ``/live`` only a process whose
event loop no longer answers is restarted.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass

from aiohttp import web

from dynamo.common.http_server import GuardedRunner
from dynamo.common.metrics_routes import debug_gc_route, metrics_route
from dynamo_gc import lifecycle
from dynamo_gc.metrics import DynamoMetrics

logger = logging.getLogger(__name__)

HEALTH_PATH = "/health"
LIVE_PATH = "/live"


async def _serve_live(request: web.Request) -> web.Response:
    return web.json_response({"status": "live", "phase": lifecycle.current_phase().value})


# Why the process is not ready beyond its phase (the worker: its model not registered yet), or
# None. Called on the event loop for every probe: it must not block.
NotReadyCheck = Callable[[], str | None]


def _not_ready_reason(check: NotReadyCheck | None) -> str | None:
    phase = lifecycle.current_phase()
    if not lifecycle.serving():
        return f"the process is {phase.value}, not serving"
    return None if check is None else check()


async def _serve_health(check: NotReadyCheck | None, request: web.Request) -> web.Response:
    reason = _not_ready_reason(check)
    body = {
        "status": "ready" if reason is None else "notready",
        "phase": lifecycle.current_phase().value,
    }
    if reason is not None:
        body["reason"] = reason
    return web.json_response(body, status=200 if reason is None else 503)


def build_system_app(
    metrics: DynamoMetrics,
    *,
    debug_gc_endpoint: bool = False,
    not_ready: NotReadyCheck | None = None,
) -> web.Application:
    """``not_ready`` adds a condition to readiness beyond the phase being ``serving``."""
    app = web.Application()
    app.router.add_get(LIVE_PATH, _serve_live)
    app.router.add_get(HEALTH_PATH, functools.partial(_serve_health, not_ready))
    metrics_route(app, metrics)
    if debug_gc_endpoint:
        debug_gc_route(app)
    return app


@dataclass
class SystemServer:
    """A started system server; :meth:`stop` it on shutdown."""

    runner: web.AppRunner
    host: str
    port: int

    async def stop(self) -> None:
        await self.runner.cleanup()


async def start_system_server(
    metrics: DynamoMetrics,
    *,
    host: str,
    port: int,
    debug_gc_endpoint: bool = False,
    not_ready: NotReadyCheck | None = None,
) -> SystemServer:
    """Listen on ``host:port`` (0 picks a free port) and log the address actually bound."""
    app = build_system_app(metrics, debug_gc_endpoint=debug_gc_endpoint, not_ready=not_ready)
    # no access log: probes every few seconds would drown the log
    runner = GuardedRunner(app, what="system server")
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound_port = runner.addresses[0][1]  # the real port when 0 was asked for
    logger.info(
        "System server listening on http://%s:%d (/live, /health, /metrics)", host, bound_port
    )
    return SystemServer(runner=runner, host=host, port=bound_port)
