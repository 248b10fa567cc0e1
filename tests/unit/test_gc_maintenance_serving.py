"""The worker's request plane with its admission gate, in process: what a withdrawn worker answers,
where a held request waits, and that the serving path (requests, the pause logger's callback
feeding the trigger, the idle maintainer) walks no heap while the trigger fires and a
maintenance runs."""

from __future__ import annotations

import asyncio
import contextlib
import gc

import aiohttp
import pytest

from dynamo.runtime import request_plane
from dynamo.runtime.request_plane import GenerateRequest, WorkerWithdrawn
from dynamo.runtime.sampling import SamplingOptions
from dynamo.vllm.mock_engine import MockEngine
from dynamo.vllm.mock_model import load_mock_model
from dynamo.vllm.request_plane_server import RequestPlaneServer
from dynamo_gc import lifecycle, maintainer
from dynamo_gc.admission import AdmissionGate
from dynamo_gc.configuration.gc_options import GcSettings, MaintenanceSettings
from dynamo_gc.freeze import freeze_gc_heap
from dynamo_gc.gc_builds import GEN2_NEVER, threshold2_ignored_reason
from dynamo_gc.maintenance import settle_after_freeze
from dynamo_gc.pause_logger import installed_gc_pause_logger
from dynamo_gc.process_gc import start_process_gc
from tests.support import wait_until_async

DEADLINE_S = 60.0
MODEL = "served"


def run(scenario):
    return asyncio.run(asyncio.wait_for(scenario(), DEADLINE_S))


@contextlib.asynccontextmanager
async def worker_plane(tiny_tokenizer_dir, gate: AdmissionGate, **engine_args):
    engine = MockEngine(
        load_mock_model(tiny_tokenizer_dir, served_model_name=MODEL), token_ms=0, **engine_args
    )
    plane = RequestPlaneServer(engine, "127.0.0.1", 0, drain_grace_s=1.0, gate=gate)
    endpoint = await plane.open()
    try:
        async with aiohttp.ClientSession(auto_decompress=False) as session:
            yield engine, endpoint, session
    finally:
        await plane.close()


def generate_request(index: int) -> GenerateRequest:
    return GenerateRequest(
        request_id=f"r{index}",
        model=MODEL,
        token_ids=[5, 6, 7],
        sampling=SamplingOptions(max_tokens=2, ignore_eos=True),
    )


async def generate(session, endpoint: str, index: int) -> list:
    stream = request_plane.generate(session, endpoint, generate_request(index))
    return [item async for item in stream]


def test_a_withdrawn_worker_answers_the_distinct_503_and_its_health_says_withdrawn(
    tiny_tokenizer_dir,
):
    lifecycle.mark_serving("test")

    async def scenario():
        gate = AdmissionGate()
        async with worker_plane(tiny_tokenizer_dir, gate) as (engine, endpoint, session):
            assert len(await generate(session, endpoint, 0)) == 3
            assert gate.turned_away_at is None
            gate.withdrawn = True
            with pytest.raises(WorkerWithdrawn):
                await generate(session, endpoint, 1)
            assert gate.turned_away_at is not None  # what the withdrawal's settle time reads
            async with session.get(endpoint + request_plane.HEALTH_PATH) as health:
                assert (health.status, await health.json()) == (503, {"status": "withdrawn"})
            assert engine.requests_started == 1 and gate.in_flight == 0
            gate.withdrawn = False
            assert len(await generate(session, endpoint, 2)) == 3

    run(scenario)


def test_a_request_arriving_at_the_held_gate_waits_then_is_served(tiny_tokenizer_dir):
    lifecycle.mark_serving("test")

    async def scenario():
        gate = AdmissionGate()
        async with worker_plane(tiny_tokenizer_dir, gate) as (engine, endpoint, session):
            gate.hold()
            waiting = asyncio.ensure_future(generate(session, endpoint, 0))
            await wait_until_async(lambda: gate.waiting == 1, deadline_s=DEADLINE_S)
            assert engine.requests_started == 0 and not waiting.done()
            (wait,) = gate.release()
            assert wait >= 0
            assert len(await waiting) == 3 and engine.requests_started == 1

    run(scenario)


@pytest.fixture
def no_heap_walks(monkeypatch):
    """gc.get_objects / get_referrers / get_freeze_count fail, and are counted, from here on."""
    calls: list[str] = []

    def forbidden(name):
        def walk(*args, **kwargs):
            calls.append(name)
            raise AssertionError(f"gc.{name} walked the heap in the serving path")

        return walk

    for name in ("get_objects", "get_referrers", "get_freeze_count"):
        monkeypatch.setattr(gc, name, forbidden(name))
    return calls


@pytest.fixture
def started_with_idle_maintenance():
    """A process as a launcher leaves it once serving with ``idle`` maintenance: metrics, the
    pause logger feeding the trigger, the start-up heap frozen (its one count, before serving)
    and settled. Any serving full collection makes a maintenance due (a budget of 1 us)."""
    process = start_process_gc(GcSettings(True, 0.0), MaintenanceSettings("idle", 0.001))
    freeze_gc_heap(context="start-up")
    settle_after_freeze()
    lifecycle.mark_serving("test")
    yield process
    process.state.restore()


def test_no_heap_walk_runs_in_the_serving_path_while_the_trigger_fires(
    tiny_tokenizer_dir, monkeypatch, started_with_idle_maintenance, no_heap_walks
):
    """With CPython's full collections held off (where the build allows), the maintenance is
    made due by the growth's walk estimated from CPython's counters; otherwise by a serving
    full collection's pause. Either way nothing in the serving path walks the heap."""
    monkeypatch.setattr(maintainer, "POLL_S", 0.005)
    parts = started_with_idle_maintenance.maintenance
    assert parts is not None

    async def scenario():
        gate = AdmissionGate()
        task = parts.maintainer(parts.idle_quiescence(gate), context="vllm worker", pause_log_ms=0)
        async with worker_plane(tiny_tokenizer_dir, gate, heap_growth=500) as (_, url, session):
            task.start()
            index = 0
            # Requests (each keeping 500 objects) until the heap's growth has brought a serving
            # full collection, the trigger has fired and the maintainer has maintained.
            while task.maintenances < 1:
                await asyncio.gather(*(generate(session, url, index + i) for i in range(8)))
                index += 8
            await task.stop()

    run(scenario)
    if threshold2_ignored_reason() is None:
        # Held off while serving: the growth's walk, estimated from counters, made it due, and
        # no automatic full collection ran in the serving path.
        assert parts.trigger.serving_full_collections == 0
        registry = started_with_idle_maintenance.metrics.registry
        labels = {"mode": "idle", "reason": "ahead"}
        assert registry.get_sample_value("dynamo_gc_maintenance_total", labels) >= 1
    else:
        assert parts.trigger.serving_full_collections >= 1
    assert gc.get_threshold()[2] != GEN2_NEVER  # given back at the stop
    pause_logger = installed_gc_pause_logger()
    assert pause_logger is not None and pause_logger.callback_errors == 0
    assert no_heap_walks == []
