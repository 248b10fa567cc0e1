"""The mock engine: token echo, aborts, the start-up heap, and delegation to the rank group."""

from __future__ import annotations

import asyncio
import sys
import types

import pytest

from dynamo.common.utils.synthetic_heap import TRACKED_PER_UNIT
from dynamo.vllm import backend_args, engine_factory
from dynamo.vllm.engine import EngineUnavailable
from dynamo.vllm.mock_engine import MockEngine, mock_completion


async def collect(engine: MockEngine, request: dict) -> list[dict]:
    return [item async for item in engine.generate(request)]


def test_echoes_the_prompt_then_counts_up_to_max_tokens():
    engine = MockEngine("m", token_ms=0)
    request = {"request_id": "r", "token_ids": [41, 42], "max_tokens": 5}
    items = asyncio.run(collect(engine, request))
    assert [item["token_ids"] for item in items[:-1]] == [[41], [42], [2], [3], [4]]
    assert items[-1] == {"finish_reason": "length", "prompt_tokens": 2, "completion_tokens": 5}
    assert (engine.requests_started, engine.requests_finished, engine.requests_aborted) == (1, 1, 0)


def test_a_prompt_longer_than_max_tokens_is_cut_at_max_tokens():
    assert mock_completion([9, 8, 7, 6], 2) == [9, 8]
    engine = MockEngine("m", token_ms=0)
    items = asyncio.run(collect(engine, {"token_ids": [9, 8, 7, 6], "max_tokens": 2}))
    assert [item["token_ids"] for item in items[:-1]] == [[9], [8]]
    assert items[-1]["finish_reason"] == "length"


def test_an_empty_prompt_gives_counted_tokens():
    assert mock_completion([], 3) == [0, 1, 2]


def test_closing_the_stream_aborts_the_request():
    engine = MockEngine("m", token_ms=0)

    async def read_one_then_close():
        stream = engine.generate({"request_id": "gone", "token_ids": [1, 2, 3], "max_tokens": 10})
        first = await stream.__anext__()
        await stream.aclose()
        return first

    assert asyncio.run(read_one_then_close()) == {"token_ids": [1]}
    assert (engine.requests_finished, engine.requests_aborted) == (0, 1)


def test_cancelling_the_consumer_aborts_the_request():
    engine = MockEngine("m", token_ms=60_000)  # the first step never ends by itself

    async def cancel_mid_step():
        task = asyncio.ensure_future(collect(engine, {"token_ids": [1], "max_tokens": 2}))
        while engine.requests_started == 0:  # the task reaches the engine's first step
            await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(asyncio.wait_for(cancel_mid_step(), 30))
    assert engine.requests_aborted == 1


def test_start_builds_and_keeps_the_synthetic_heap(caplog):
    caplog.set_level("INFO")
    engine = MockEngine("m", heap_objects=50_000)
    asyncio.run(engine.start())
    assert len(engine.heap) * TRACKED_PER_UNIT == 50_000
    assert "synthetic start-up heap of ~50000 tracked objects" in caplog.text
    asyncio.run(engine.shutdown())
    assert len(engine.heap) * TRACKED_PER_UNIT == 50_000  # long-lived: kept for the process


def test_no_heap_by_default():
    engine = MockEngine("m")
    asyncio.run(engine.start())
    assert engine.heap == []


def test_forward_pass_without_ranks_is_a_clear_error():
    engine = MockEngine("m")
    asyncio.run(engine.start())
    with pytest.raises(RuntimeError, match="no rank processes: the self-benchmark is off"):
        asyncio.run(engine.forward_pass(4, 128))
    with pytest.raises(RuntimeError, match="no rank processes"):
        asyncio.run(engine.collective_rpc("anything"))


class FakeRankGroup:
    """Records what the engine asks of its rank group (the real one is tested on its own)."""

    instances: list["FakeRankGroup"] = []

    def __init__(self, size, *, worker_extension_cls):
        self.size = size
        self.worker_extension_cls = worker_extension_cls
        self.calls: list = []
        FakeRankGroup.instances.append(self)

    async def start(self):
        self.calls.append("start")

    async def collective_rpc(self, method, args=()):
        self.calls.append((method, tuple(args)))
        return [None] * self.size

    async def shutdown(self):
        self.calls.append("shutdown")


@pytest.fixture
def fake_ranks(mocker):
    FakeRankGroup.instances = []
    module = types.ModuleType("dynamo.vllm.ranks")
    module.RankGroup = FakeRankGroup
    mocker.patch.dict(sys.modules, {"dynamo.vllm.ranks": module})
    return FakeRankGroup.instances


def config_for(*argv: str):
    return backend_args.parse_args(["--discovery-dir", "/nonexistent", *argv], env={})


@pytest.mark.parametrize(
    "argv, size",
    [(["--self-benchmark-points", "3"], 1), (["--tensor-parallel-size", "2"], 2)],
)
def test_rank_group_started_for_the_benchmark_or_tensor_parallel(fake_ranks, argv, size):
    engine = engine_factory.build_engine(config_for(*argv), worker_extension_cls="pkg.Ext")

    async def scenario():
        await engine.start()
        await engine.forward_pass(8, 256)
        result = await engine.collective_rpc("fpm_gc_start")
        await engine.shutdown()
        return result

    assert asyncio.run(scenario()) == [None] * size
    (group,) = fake_ranks
    assert (group.size, group.worker_extension_cls) == (size, "pkg.Ext")
    assert group.calls == [
        "start",
        ("execute_forward", (8, 256)),
        ("fpm_gc_start", ()),
        "shutdown",
    ]


def test_no_rank_group_when_neither_is_configured(fake_ranks):
    engine = engine_factory.build_engine(config_for())
    asyncio.run(engine.start())
    assert fake_ranks == []


def test_factory_builds_the_mock_engine_from_the_options():
    engine = engine_factory.build_engine(
        config_for("--model", "m1", "--mock-token-ms", "7", "--mock-heap-objects", "30")
    )
    assert isinstance(engine, MockEngine)
    assert (engine.model_name, engine.token_s, engine.heap_objects) == ("m1", 0.007, 30)


def test_factory_without_vllm_names_the_way_out(mocker):
    mocker.patch.dict(sys.modules, {"vllm": None})  # `import vllm` raises ImportError
    with pytest.raises(EngineUnavailable) as excinfo:
        engine_factory.build_engine(config_for("--engine", "vllm"))
    message = str(excinfo.value)
    assert "vLLM is not installed" in message
    assert "scripts/setup_vllm_env.sh" in message
    assert "--engine mock" in message
