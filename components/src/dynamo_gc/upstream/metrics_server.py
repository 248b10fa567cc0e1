"""The ``dynamo_gc_*`` metrics of upstream's frontend, on a port of their own.

Upstream's ``/metrics`` is rendered by its Rust HTTP service from its own registry; the Python
hooks upstream offers for foreign metrics (``Endpoint.metrics.register_prometheus_expfmt_callback``)
belong to a worker's endpoint, which the frontend does not have, and a route extension
(``FrontendRoute``) answers JSON only. So the adapter serves its registry itself, with
prometheus_client's threaded HTTP server (the Accept header picks text or OpenMetrics, as
Prometheus expects), only when the operator names a port.
"""

from __future__ import annotations

import logging
import sys
import threading
from typing import Any

from prometheus_client import start_http_server

from dynamo_gc.metrics import DynamoMetrics

logger = logging.getLogger(__name__)

_lock = threading.Lock()
_server: Any = None


def serve(
    metrics: DynamoMetrics,
    host: str,
    port: int,
    *,
    option: str = "--dyn-gc-metrics-port / DYN_GC_METRICS_PORT",
) -> int:
    """Serve ``metrics`` on ``host:port`` (0: a free port) and return the bound port.

    A port that cannot be bound is an error at start-up (before upstream's HTTP service starts),
    never a silently missing scrape target; the message names ``option`` (the flag and env var
    of the program that asked for the port).
    """
    global _server
    with _lock:
        if _server is not None:
            raise RuntimeError("the GC metrics server is already running in this process")
        try:
            server, _thread = start_http_server(port, addr=host, registry=metrics.registry)
        except OSError as exc:
            # exit 2 like every other start-up refusal of a setting
            print(
                f"dynamo_gc: cannot serve the GC metrics on {host}:{port} ({option}): {exc}",
                file=sys.stderr,
            )
            raise SystemExit(2) from None
        _server = server
    bound = int(server.server_port)
    logger.info("GC metrics served on http://%s:%d/metrics", host, bound)
    return bound


def stop() -> None:
    """Close the metrics server, if one runs (tests start many in one process)."""
    global _server
    with _lock:
        server, _server = _server, None
    if server is not None:
        server.shutdown()
        server.server_close()
