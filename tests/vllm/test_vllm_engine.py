"""VllmEngine embedded in this process, as the worker embeds it: one AsyncLLM on the tiny model
(its EngineCore and rank worker are real child processes) serves every test in this module.

The rank loads the self-benchmark's worker extension, so ``collective_rpc`` reaches the GC policy
in the real rank process and returns each rank's GC state.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os

import pytest

from dynamo.vllm import backend_args
from dynamo.vllm.self_benchmark_args import POLICY_FREEZE
from tests.vllm.conftest import OFFLINE_ENV, VLLM_ARGS

pytestmark = [pytest.mark.vllm, pytest.mark.integration]

ENGINE_DEADLINE_S = 300.0


@contextlib.contextmanager
def _environ(values: dict[str, str]):
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


class EmbeddedEngine:
    """A VllmEngine and the one event loop it lives on (AsyncLLM binds to the first loop)."""

    def __init__(self, engine, loop: asyncio.AbstractEventLoop) -> None:
        self.engine = engine
        self.loop = loop

    def run(self, coroutine, timeout_s: float = 120.0):
        return self.loop.run_until_complete(asyncio.wait_for(coroutine, timeout_s))

    def rpc(self, method: str) -> list:
        return self.run(self.engine.collective_rpc(method))


@pytest.fixture(scope="module")
def embedded(tiny_model):
    from dynamo.vllm import gc_policy, vllm_engine
    from dynamo.vllm.worker_extension import QUALNAME

    config = backend_args.parse_args(
        ["--engine", "vllm", "--model", tiny_model, *VLLM_ARGS], env={}
    )
    engine = vllm_engine.build_vllm_engine(config, worker_extension_cls=QUALNAME)
    loop = asyncio.new_event_loop()
    # The rank reads the policy from the environment it is started with (as under the worker,
    # which exports it before engine init).
    policy_env = gc_policy.policy_env(gc_policy.PolicyConfig(POLICY_FREEZE, 60.0))
    try:
        with _environ({**OFFLINE_ENV, **policy_env}):
            loop.run_until_complete(asyncio.wait_for(engine.start(), ENGINE_DEADLINE_S))
        yield EmbeddedEngine(engine, loop)
    finally:
        loop.run_until_complete(engine.shutdown())
        loop.close()


def _collect(embedded: EmbeddedEngine, request: dict) -> list[dict]:
    async def collect():
        return [item async for item in embedded.engine.generate(request)]

    return embedded.run(collect())


def test_the_policy_starts_and_stops_in_each_real_rank(embedded):
    before = embedded.rpc("fpm_gc_state")
    assert len(before) == 1  # tensor parallel size 1: one rank
    assert before[0]["pid"] != os.getpid()  # a real rank process, not this one
    assert before[0]["policy_running"] is False

    assert embedded.rpc("fpm_gc_start") == [True]
    running = embedded.rpc("fpm_gc_state")
    assert running[0]["policy_running"] is True
    assert running[0]["freeze_thread_alive"] is True
    assert running[0]["thresholds"] != before[0]["thresholds"]  # automatic gen2 turned off
    # A real step while the policy runs in the rank.
    embedded.run(embedded.engine.forward_pass(4, 32))

    assert embedded.rpc("fpm_gc_stop") == [True]
    after = embedded.rpc("fpm_gc_state")
    assert after[0]["policy_running"] is False
    assert after[0]["freeze_thread_alive"] is False
    # The rank's GC state is as before the policy: stock thresholds, the enabled flag, and
    # frozen again exactly when it was frozen before (vLLM freezes its engine processes).
    assert after[0]["thresholds"] == before[0]["thresholds"]
    assert after[0]["isenabled"] == before[0]["isenabled"]
    assert after[0]["heap_frozen"] == before[0]["heap_frozen"], (before, after)
    assert after[0]["pid"] == before[0]["pid"]


def test_generate_streams_token_ids_then_a_final_item(embedded):
    items = _collect(embedded, {"request_id": "stream", "token_ids": [1, 2, 3, 4], "max_tokens": 6})
    final = items[-1]
    tokens = [t for item in items[:-1] for t in item["token_ids"]]
    assert final["finish_reason"] in ("length", "stop")
    assert final["prompt_tokens"] == 4
    assert final["completion_tokens"] == len(tokens)
    assert 1 <= len(tokens) <= 6
    assert all(0 <= t < embedded.engine.vocab_size for t in tokens)


def test_prompt_ids_beyond_the_models_vocab_are_mapped_into_it(embedded):
    vocab_size = embedded.engine.vocab_size
    prompt = [vocab_size, vocab_size * 3 + 5, 70_000]
    assert embedded.engine.map_token_ids(prompt) == [0, 5, 70_000 % vocab_size]
    items = _collect(embedded, {"request_id": "big-ids", "token_ids": prompt, "max_tokens": 2})
    assert items[-1]["prompt_tokens"] == 3


def test_closing_the_stream_aborts_the_request_in_vllm(embedded, caplog):
    caplog.set_level(logging.INFO, logger="dynamo.vllm.vllm_engine")
    async def read_one_then_close():
        stream = embedded.engine.generate(
            {"request_id": "closed", "token_ids": [5, 6, 7], "max_tokens": 200}
        )
        first = await stream.__anext__()
        await stream.aclose()
        return first, embedded.engine.engine.get_num_unfinished_requests()

    first, unfinished = embedded.run(read_one_then_close())
    assert first["token_ids"]
    assert "vLLM request closed-" in caplog.text and "aborted after 1 token(s)" in caplog.text
    assert unfinished == 0


def test_forward_pass_clamps_a_length_beyond_max_model_len(embedded, caplog):
    embedded.run(embedded.engine.forward_pass(2, 4 * embedded.engine.max_model_len))
    assert "does not fit max_model_len" in caplog.text
    assert embedded.engine.engine.get_num_unfinished_requests() == 0
