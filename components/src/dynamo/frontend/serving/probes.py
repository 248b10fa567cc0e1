"""The frontend's probes on its HTTP port, as upstream Dynamo's frontend serves them: ``/live``
(liveness: 200 while the process answers) and ``/health`` (readiness: 200 once it serves, with
``reason`` when not, so a probe's log says why)."""

from __future__ import annotations

from aiohttp import web

from dynamo.frontend.processors.preprocess_pool import PreprocessPool
from dynamo.frontend.routing.model_registry import ModelRegistry
from dynamo.runtime.discovery import RecordWatcher
from dynamo_gc import lifecycle

HEALTH_PATH = "/health"
LIVE_PATH = "/live"


class Probes:
    """What ``/live`` and ``/health`` answer, from the models served, the preprocess pool's
    state and discovery's."""

    def __init__(
        self,
        registry: ModelRegistry,
        pool: PreprocessPool | None = None,
        ready_min_models: int = 1,
    ) -> None:
        self._registry = registry
        self._pool = pool
        self._ready_min_models = ready_min_models  # ready from this many models on
        # The discovery watcher (set by main): /health reports its state, and is not ready
        # before its first look at the store.
        self.discovery_watcher: RecordWatcher | None = None

    def add_routes(self, app: web.Application) -> None:
        app.router.add_get(HEALTH_PATH, self.handle_health)
        app.router.add_get(LIVE_PATH, self.handle_live)

    async def handle_live(self, request: web.Request) -> web.Response:
        """Liveness, as upstream Dynamo's frontend serves it on its HTTP port: 200 whenever the
        process answers, whatever the phase (``/health`` is readiness). An upstream manifest
        whose liveness probe asks the frontend for ``/live`` must not restart it in a loop."""
        return web.json_response({"status": "live", "phase": lifecycle.current_phase().value})

    async def handle_health(self, request: web.Request) -> web.Response:
        """Readiness: 200 once the process serves at least ``--dyn-ready-min-models`` models,
        else 503 with ``reason`` saying why (a probe's log shows the body)."""
        served = len(self._registry.entries())
        # The same shape as the worker's system server, plus the number of servable models
        # (and the pool's and discovery's states when they matter).
        body: dict[str, object] = {"phase": lifecycle.current_phase().value, "models": served}
        pool = self._pool
        if pool is not None:
            body["preprocess_pool"] = pool.state
        watcher = self.discovery_watcher
        if watcher is not None and watcher.state != "ok":
            # "degraded" stays ready: the instances known are still served; "connecting"
            # (never reached the store yet) is not ready.
            body["discovery"] = watcher.state
        reason = self._not_ready_reason(served, watcher)
        ready = reason is None
        body = {"status": "ready" if ready else "notready", **body}
        if reason is not None:
            body["reason"] = reason
        return web.json_response(body, status=200 if ready else 503)

    def _not_ready_reason(self, served: int, watcher: RecordWatcher | None) -> str | None:
        phase = lifecycle.current_phase()
        if not lifecycle.serving():
            return f"the frontend is {phase.value}, not serving"
        # A preprocess pool whose rebuild failed will never tokenise again: the pod must leave
        # the load balancer (readiness) rather than answer 503 to every request. A pool being
        # rebuilt is still ready: it is back in seconds, and its requests fail fast meanwhile.
        pool = self._pool
        if pool is not None and not pool.healthy:
            return "the preprocess pool failed and could not be rebuilt"
        if watcher is not None and watcher.state == "connecting":
            return "discovery has not reached its store yet"
        if served < self._ready_min_models:
            return (
                f"{served} model(s) served, fewer than the {self._ready_min_models} that "
                "--dyn-ready-min-models / DYN_READY_MIN_MODELS asks for"
            )
        return None
