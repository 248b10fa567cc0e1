"""The admission gate of a serving-time maintenance (:class:`dynamo_gc.admission.AdmissionGate`)
on an aiohttp app: the requests it counts, where they wait while the gate is held, and the answer
a withdrawn process gives.

Only the routes ``gated`` picks go through the gate (the frontend's OpenAI API, the worker's
generate route): probes and ``/metrics`` answer whatever the gate does, and are not counted in
flight (a readiness probe must not keep a maintenance from finding its idle moment).
"""

from __future__ import annotations

from collections.abc import Callable

from aiohttp import web

from dynamo_gc.admission import AdmissionGate


def install_admission_gate(
    app: web.Application,
    gate: AdmissionGate,
    *,
    gated: Callable[[web.Request], bool],
    withdrawn: Callable[[], web.StreamResponse] | None = None,
) -> None:
    """Put ``gated`` requests through ``gate``: counted in flight, waiting while it is held, and
    answered ``withdrawn()`` at once while it is withdrawn (when given). Call before the app
    starts (its middlewares freeze then)."""

    @web.middleware
    async def admission(request: web.Request, handler):
        if not gated(request):
            return await handler(request)
        if gate.withdrawn and withdrawn is not None:
            gate.turn_away()
            return withdrawn()
        async with gate.admitted():
            return await handler(request)

    app.middlewares.append(admission)
