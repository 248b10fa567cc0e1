"""The GC layer's metrics and debug endpoints as aiohttp routes, for our launchers' servers.

The metrics themselves (:mod:`dynamo_gc.metrics`) know nothing of HTTP, so the GC layer needs no
web framework; this module serves them on the frontend's HTTP service and the worker's system
server.
"""

from __future__ import annotations

import logging

from aiohttp import web
from prometheus_client.exposition import choose_encoder

from dynamo_gc.metrics import (
    DEBUG_GC_COLLECT_PATH,
    DEBUG_GC_STATE_PATH,
    METRICS_PATH,
    DynamoMetrics,
    debug_gc_collect,
    debug_gc_state,
)

logger = logging.getLogger(__name__)


async def _serve_metrics(request: web.Request) -> web.Response:
    metrics: DynamoMetrics = request.app[_METRICS_KEY]
    # Prometheus' Accept header picks the text format or OpenMetrics, as prometheus_client's
    # own HTTP server does.
    encoder, content_type = choose_encoder(request.headers.get("Accept", ""))
    return web.Response(body=encoder(metrics.registry), headers={"Content-Type": content_type})


_METRICS_KEY = web.AppKey("dynamo_metrics", DynamoMetrics)


def metrics_route(app: web.Application, metrics: DynamoMetrics) -> None:
    """Serve ``GET /metrics`` from ``metrics`` on ``app`` (before the app starts)."""
    app[_METRICS_KEY] = metrics
    app.router.add_get(METRICS_PATH, _serve_metrics)


async def _serve_debug_gc_collect(request: web.Request) -> web.Response:
    return web.json_response(debug_gc_collect(request.app.get(_METRICS_KEY)))


async def _serve_debug_gc_state(request: web.Request) -> web.Response:
    return web.json_response(debug_gc_state())


def debug_gc_route(app: web.Application) -> None:
    """Serve ``POST /debug/gc/collect`` and ``GET /debug/gc/state`` on ``app``.

    Only when the operator's option enables it. Call :func:`metrics_route` first, so the
    collection's answer can report the pause histogram's count.
    """
    app.router.add_post(DEBUG_GC_COLLECT_PATH, _serve_debug_gc_collect)
    app.router.add_get(DEBUG_GC_STATE_PATH, _serve_debug_gc_state)
    logger.warning(
        "Debug endpoints enabled: POST %s pauses this process for one full collection; "
        "GET %s walks the frozen objects to count them",
        DEBUG_GC_COLLECT_PATH,
        DEBUG_GC_STATE_PATH,
    )
