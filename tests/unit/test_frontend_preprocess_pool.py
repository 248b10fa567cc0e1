"""The preprocess pool: N spawned processes, all initialised during start(), encoding like the
frontend's own tokenizer."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest

from dynamo.frontend.preprocess_pool import PreprocessPool
from dynamo.frontend.tokenizer import ByteTokenizer
from tests.integration.harness import wait_until


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


def test_a_broken_pool_answers_503_instead_of_losing_the_request():
    from aiohttp.test_utils import TestClient, TestServer

    from dynamo.frontend.chat_processor import build_chat_processor
    from dynamo.frontend.http_service import FrontendService
    from dynamo.frontend.model_registry import ModelRegistry
    from dynamo.frontend.preprocess_pool import PreprocessPoolError
    from dynamo.frontend.worker_router import WorkerRouter, create_worker_session
    from dynamo.runtime.discovery import ModelRecord

    pool = PreprocessPool(1, freeze_gc_heap=False, gc_pause_log_ms=0.0)
    try:
        (pid,) = pool.start()
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(PreprocessPoolError):
            asyncio.run(pool.encode("hello"))

        async def scenario():
            registry = ModelRegistry(build_chat_processor)
            registry.add_instance(ModelRecord(model="m", endpoint="http://127.0.0.1:9"))
            session = create_worker_session()
            app = FrontendService(registry, WorkerRouter(session), pool).build_app()
            try:
                async with TestClient(TestServer(app, host="127.0.0.1")) as client:
                    response = await client.post(
                        "/v1/chat/completions",
                        json={"model": "m", "messages": [{"role": "user", "content": "x"}]},
                    )
                    return response.status, await response.json()
            finally:
                await session.close()

        status, body = asyncio.run(scenario())
        assert status == 503 and body["error"]["code"] == "preprocess_unavailable"
    finally:
        pool.shutdown()
