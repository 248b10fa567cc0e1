"""The preprocess pool: N spawned processes, all initialised during start(), encoding like the
frontend's own tokenizer; a pool broken by a dead process is rebuilt once, off the event loop,
and one whose rebuild fails takes /health down."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import threading

import pytest
from aiohttp.test_utils import TestClient, TestServer

from dynamo.common import lifecycle
from dynamo.frontend.chat_processor import build_chat_processor
from dynamo.frontend.http_service import FrontendService
from dynamo.frontend.model_registry import ModelRegistry
from dynamo.frontend.preprocess_pool import PreprocessPool, PreprocessPoolError
from dynamo.frontend.tokenizer import ByteTokenizer
from dynamo.frontend.worker_router import WorkerRouter, create_worker_session
from dynamo.runtime.discovery import ModelRecord
from dynamo.vllm.mock_engine import MockEngine
from dynamo.vllm.mock_model import load_mock_model
from tests.integration.harness import tiny_tokenizer_dir
from tests.integration.harness import wait_until
from tests.unit.test_frontend_http_service import request_plane_server

MODEL = "pool-model"
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 4}
DEADLINE_S = 60.0


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_start_initialises_every_process_before_returning_and_encodes_like_in_process():
    pool = PreprocessPool(2, freeze_gc_heap=False, gc_pause_log_ms=0.0)
    try:
        pids = pool.start()
        assert len(set(pids)) == 2 and os.getpid() not in pids
        assert all(alive(pid) for pid in pids)
        texts = ["<|im_start|>user\nhi 🧊<|im_end|>\n", "plain", ""]

        async def encode_all():
            return await asyncio.gather(*(pool.encode(text) for text in texts))

        assert asyncio.run(encode_all()) == [ByteTokenizer().encode(t) for t in texts]
    finally:
        pool.shutdown()
    # shutdown() waits for the processes; the kernel may take a moment to reap them.
    wait_until(lambda: not any(alive(pid) for pid in pids), deadline_s=30, what="pool exit")


def test_a_pool_needs_a_worker():
    with pytest.raises(ValueError):
        PreprocessPool(0, freeze_gc_heap=True, gc_pause_log_ms=0.0)


@pytest.fixture
def pool():
    pool = PreprocessPool(1, freeze_gc_heap=False, gc_pause_log_ms=0.0)
    pool.start()
    yield pool
    pool.shutdown()


async def _until(condition, deadline_s: float = DEADLINE_S) -> None:
    async def poll() -> None:
        while not condition():
            await asyncio.sleep(0.01)

    await asyncio.wait_for(poll(), deadline_s)


class Service:
    """The real HTTP service on a loopback test server, its worker a real mock engine."""

    def __init__(self, client: TestClient) -> None:
        self.client = client

    async def chat(self) -> tuple[int, dict]:
        response = await self.client.post("/v1/chat/completions", json=CHAT)
        return response.status, await response.json()

    async def health(self) -> tuple[int, dict]:
        response = await self.client.get("/health")
        return response.status, await response.json()


async def _serve(pool: PreprocessPool, scenario):
    engine = MockEngine(load_mock_model(tiny_tokenizer_dir(), served_model_name=MODEL), token_ms=0)
    await engine.start()
    async with request_plane_server(engine.generate, MODEL) as endpoint:
        registry = ModelRegistry(build_chat_processor)
        registry.add_instance(ModelRecord(model=MODEL, endpoint=endpoint))
        session = create_worker_session()
        app = FrontendService(registry, WorkerRouter(session), pool).build_app()
        lifecycle.mark_serving("test")
        try:
            async with TestClient(TestServer(app, host="127.0.0.1")) as client:
                return await scenario(Service(client))
        finally:
            await session.close()
            await pool.aclose()


def _records(caplog, level: int, text: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.levelno == level and text in r.getMessage()]


def test_a_dead_process_gets_503s_then_the_pool_is_rebuilt_and_serves_again(pool, caplog):
    caplog.set_level(logging.INFO)
    (old_pid,) = pool.pids

    async def scenario(service: Service):
        assert (await service.chat())[0] == 200
        os.kill(old_pid, signal.SIGKILL)
        wait_until(lambda: not alive(old_pid), deadline_s=DEADLINE_S, what="the child to die")
        broken = await service.chat()  # this request finds the pool broken
        during = [await service.chat(), await service.health()]
        await _until(lambda: pool.state == "ready")
        return broken, during, await service.chat(), await service.health()

    broken, during, after, health = asyncio.run(_serve(pool, scenario))
    assert broken[0] == 503 and broken[1]["error"]["code"] == "preprocess_unavailable"
    (status, body), (health_status, health_body) = during
    if status == 503:  # unless the rebuild was already done (a fast machine)
        assert body["error"]["code"] == "preprocess_unavailable"
        assert "rebuilt" in body["error"]["message"]
    assert health_status == 200  # rebuilding is still ready: it is back in seconds
    assert after[0] == 200, after
    assert health == (
        200, {"status": "ready", "phase": "serving", "models": 1, "preprocess_pool": "ready"}
    )  # fmt: skip
    (new_pid,) = pool.pids
    assert new_pid != old_pid and pool.rebuilds == 1
    assert len(_records(caplog, logging.WARNING, "Preprocess pool broke")) == 1
    assert len(_records(caplog, logging.INFO, "Preprocess pool rebuilt")) == 1
    # One line per failed request, at WARNING; never an ERROR for a rebuild that worked.
    failed = _records(caplog, logging.WARNING, "POST /v1/chat/completions -> 503")
    assert len(failed) == 1 + (status == 503)
    assert _records(caplog, logging.ERROR, "") == []


def test_the_rebuild_runs_off_the_event_loop(pool, mocker):
    real_spawn = pool._spawn
    spawned_in: list[int] = []

    def spawn():
        spawned_in.append(threading.get_ident())
        return real_spawn()

    mocker.patch.object(pool, "_spawn", spawn)
    os.kill(pool.pids[0], signal.SIGKILL)

    async def scenario() -> int:
        with pytest.raises(PreprocessPoolError):
            await pool.encode("x")
        await _until(lambda: pool.state == "ready")
        assert await pool.encode("ok") == ByteTokenizer().encode("ok")
        await pool.aclose()
        return threading.get_ident()

    loop_thread = asyncio.run(scenario())
    assert len(spawned_in) == 1 and spawned_in[0] != loop_thread


def test_a_failed_rebuild_turns_health_503_and_logs_one_error(pool, mocker, caplog):
    mocker.patch.object(
        pool, "_spawn", side_effect=PreprocessPoolError("preprocess workers failed to start")
    )

    async def scenario(service: Service):
        os.kill(pool.pids[0], signal.SIGKILL)
        wait_until(lambda: pool_child_dead(pool), deadline_s=DEADLINE_S, what="the child to die")
        first = await service.chat()
        await _until(lambda: pool.state == "failed")
        return first, [await service.chat() for _ in range(3)], await service.health()

    first, later, health = asyncio.run(_serve(pool, scenario))
    assert first[0] == 503
    for status, body in later:
        assert status == 503 and body["error"]["code"] == "preprocess_unavailable"
        assert "down" in body["error"]["message"]
    assert health[0] == 503
    assert health[1]["status"] == "notready" and health[1]["preprocess_pool"] == "failed"
    assert not pool.healthy
    errors = _records(caplog, logging.ERROR, "")
    assert len(errors) == 1 and "Preprocess pool rebuild failed" in errors[0].getMessage()
    assert len(_records(caplog, logging.WARNING, "POST /v1/chat/completions -> 503")) == 4


def pool_child_dead(pool: PreprocessPool) -> bool:
    return not any(alive(pid) for pid in pool.pids)
