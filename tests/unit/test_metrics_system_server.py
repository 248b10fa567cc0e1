"""The worker's system server, on a real loopback socket: /live, /health by phase, /metrics, debug
GC."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from dynamo.common.system_server import start_system_server
from dynamo_gc import freeze, lifecycle, pause_logger
from dynamo_gc.metrics import DynamoMetrics
from tests.support.scrape import sample


@pytest.fixture
def process_metrics():
    m = DynamoMetrics(freeze_enabled=True).attach()
    yield m
    m.detach()


def run_against_server(
    m: DynamoMetrics, scenario, *, debug_gc_endpoint: bool = False, not_ready=None
):
    """Start the server on a free loopback port, run ``scenario(session, base_url)``, stop."""

    async def main():
        server = await start_system_server(
            m, host="127.0.0.1", port=0, debug_gc_endpoint=debug_gc_endpoint, not_ready=not_ready
        )
        try:
            async with aiohttp.ClientSession() as session:
                return await scenario(session, f"http://127.0.0.1:{server.port}")
        finally:
            await server.stop()

    return asyncio.run(main())


async def in_each_phase(read) -> list:
    """``await read()`` in the starting, the serving and the draining phase, in turn."""
    seen = []
    for advance in (None, lifecycle.mark_serving, lifecycle.mark_draining):
        if advance is not None:
            advance("test")
        seen.append(await read())
    return seen


def test_health_follows_the_serving_phase(process_metrics):
    async def scenario(session, base):
        async def health():
            async with session.get(base + "/health") as response:
                return response.status, (await response.json())["phase"]

        return await in_each_phase(health)

    assert run_against_server(process_metrics, scenario) == [
        (503, "starting"),
        (200, "serving"),
        (503, "draining"),
    ]


def test_health_waits_for_the_services_own_condition_and_says_why(process_metrics):
    """The worker's: serving, but its model not registered yet, is not ready; the 503's body
    names the reason (the phase's, or the service's)."""
    registered = False

    def not_ready():
        return None if registered else "the model is not registered in discovery yet"

    async def scenario(session, base):
        async def health():
            async with session.get(base + "/health") as response:
                return response.status, await response.json()

        starting = await health()
        lifecycle.mark_serving("test")
        unregistered = await health()
        nonlocal registered
        registered = True
        return starting, unregistered, await health()

    starting, unregistered, ready = run_against_server(
        process_metrics, scenario, not_ready=not_ready
    )
    assert starting == (
        503,
        {
            "status": "notready",
            "phase": "starting",
            "reason": "the process is starting, not serving",
        },
    )
    assert unregistered == (
        503,
        {
            "status": "notready",
            "phase": "serving",
            "reason": "the model is not registered in discovery yet",
        },
    )
    assert ready == (200, {"status": "ready", "phase": "serving"})


def test_live_answers_200_in_every_phase_beside_health(process_metrics):
    async def scenario(session, base):
        async def live_and_health():
            async with session.get(base + "/live") as live, session.get(base + "/health") as health:
                return live.status, (await live.json())["phase"], health.status

        return await in_each_phase(live_and_health)

    assert run_against_server(process_metrics, scenario) == [
        (200, "starting", 503),
        (200, "serving", 200),
        (200, "draining", 503),
    ]


def test_metrics_are_served_in_the_text_format(process_metrics):
    frozen = freeze.freeze_gc_heap(context="system server test")
    assert frozen is not None

    async def scenario(session, base):
        async with session.get(base + "/metrics") as response:
            return response.status, response.headers["Content-Type"], await response.text()

    status, content_type, body = run_against_server(process_metrics, scenario)
    assert status == 200
    assert content_type.startswith("text/plain")
    assert sample(body, "dynamo_gc_frozen_objects") == frozen
    assert 'dynamo_serving_phase{phase="starting"} 1.0' in body


def test_debug_gc_route_is_off_by_default(process_metrics):
    async def scenario(session, base):
        async with session.post(base + "/debug/gc/collect") as response:
            return response.status

    assert run_against_server(process_metrics, scenario) in (404, 405)


def test_debug_gc_route_collects_once(process_metrics):
    pause_logger.install_gc_pause_logger(0, on_pause=process_metrics.observe_pause)

    async def scenario(session, base):
        async with session.post(base + "/debug/gc/collect") as response:
            return response.status, await response.json()

    status, result = run_against_server(process_metrics, scenario, debug_gc_endpoint=True)
    assert status == 200
    assert result["gen2_collections_delta"] == 1
    before = result["pause_histogram_gen2_count_before"]
    assert result["pause_histogram_gen2_count_after"] == before + 1
    assert process_metrics.pauses.count(2) >= before + 1


def test_the_system_port_options_name_every_route_it_serves(process_metrics):
    # An operator reads --help or docs/configuration to find the probe paths: /live included.
    from dynamo.common.system_server import build_system_app
    from dynamo.vllm import backend_args

    app = build_system_app(process_metrics)
    paths = {route.resource.canonical for route in app.router.routes() if route.method == "GET"}
    assert {"/live", "/health", "/metrics"} <= paths
    for option in (backend_args.SYSTEM_PORT, backend_args.SYSTEM_HOST):
        missing = {path for path in paths if path not in option.help}
        assert not missing, f"--{option.name} help does not name {missing}"
