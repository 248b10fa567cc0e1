"""The preprocess pool: N spawned processes, all initialised during start(), encoding like the
frontend's own processor for whichever model a task names (each process loads and caches the
tokenizers it is asked about); a pool broken by a dead process is rebuilt once, off the event
loop, and one whose rebuild fails takes /health down."""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
import signal
import sys
import threading

import pytest
from aiohttp.test_utils import TestClient, TestServer

from dynamo.frontend.processors.chat_processor import build_chat_processor
from dynamo.frontend.processors.preprocess_pool import PreprocessPool, PreprocessPoolError
from dynamo.frontend.routing.model_registry import ModelRegistry
from dynamo.frontend.routing.worker_router import WorkerRouter, create_worker_session
from dynamo.frontend.serving.http_service import FrontendService
from dynamo.runtime.discovery import ModelRecord
from dynamo_gc import lifecycle
from dynamo_gc.freeze import freeze_gc_heap, last_freeze
from tests.support import wait_until, wait_until_async
from tests.support.frontend_fakes import echo_worker
from tests.support.processes import pid_alive
from tests.support.tiny_model import build_tiny_tokenizer, tiny_card

MODEL = "pool-model"
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 4}
DEADLINE_S = 60.0


@pytest.fixture
def card(tiny_tokenizer_dir):
    return tiny_card(tiny_tokenizer_dir, MODEL)


def test_start_initialises_every_process_before_returning_and_encodes_like_in_process(
    card, tmp_path
):
    # A second model with another vocabulary: each task is tokenised for the model it names.
    other_dir = build_tiny_tokenizer(tmp_path / "other")
    (other_dir / "tokenizer.json").write_text(
        (other_dir / "tokenizer.json").read_text(encoding="utf-8").replace('"<|pad|>"', '"<|x|>"'),
        encoding="utf-8",
    )
    other = tiny_card(other_dir, "other")
    pool = PreprocessPool(2, freeze_gc_heap=False, gc_pause_log_ms=0.0)
    try:
        pids = pool.start()
        assert len(set(pids)) == 2 and os.getpid() not in pids
        assert all(pid_alive(pid) for pid in pids)
        texts = ["<|begin_of_text|><|user|>\nhi 🧊<|end_of_text|>\n", "plain", "", "<|x|>"]
        tasks = [(c, t, special) for c in (card, other) for t in texts for special in (0, 1)]

        async def encode_all():
            return await asyncio.gather(
                *(pool.encode(c, t, add_special_tokens=bool(s)) for c, t, s in tasks)
            )

        expected = []
        for c, t, special in tasks:
            processor = build_chat_processor(c)
            expected.append(processor.encode_completion(t) if special else processor.encode_chat(t))
        got = asyncio.run(encode_all())
        assert got == expected
        assert got[tasks.index((card, "<|x|>", 0))] != got[tasks.index((other, "<|x|>", 0))]
    finally:
        pool.shutdown()
    # shutdown() waits for the processes; the kernel may take a moment to reap them.
    wait_until(lambda: not any(pid_alive(pid) for pid in pids), deadline_s=30, what="pool exit")


def test_a_pool_needs_a_worker():
    with pytest.raises(ValueError):
        PreprocessPool(0, freeze_gc_heap=True, gc_pause_log_ms=0.0)


@pytest.fixture
def pool(card):
    pool = PreprocessPool(1, freeze_gc_heap=False, gc_pause_log_ms=0.0)
    pool.start()
    yield pool
    pool.shutdown()


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


async def _serve(pool: PreprocessPool, card, scenario):
    async with echo_worker() as (_, endpoint):
        registry = ModelRegistry(build_chat_processor)
        registry.add_instance(ModelRecord(model=MODEL, endpoint=endpoint, card=card))
        await registry.wait_idle()
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


def test_a_dead_process_gets_503s_then_the_pool_is_rebuilt_and_serves_again(pool, card, caplog):
    caplog.set_level(logging.INFO)
    (old_pid,) = pool.pids

    async def scenario(service: Service):
        assert (await service.chat())[0] == 200
        os.kill(old_pid, signal.SIGKILL)
        wait_until(lambda: not pid_alive(old_pid), deadline_s=DEADLINE_S, what="the child to die")
        broken = await service.chat()  # this request finds the pool broken
        during = [await service.chat(), await service.health()]
        await wait_until_async(lambda: pool.state == "ready", deadline_s=DEADLINE_S)
        return broken, during, await service.chat(), await service.health()

    broken, during, after, health = asyncio.run(_serve(pool, card, scenario))
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
    # One WARNING for the failed requests of one cause (budgeted per cause, not one per
    # request); never an ERROR for a rebuild that worked.
    failed = _records(caplog, logging.WARNING, "POST /v1/chat/completions -> 503")
    assert len(failed) == 1
    assert _records(caplog, logging.ERROR, "") == []


def test_the_rebuild_runs_off_the_event_loop(pool, card, mocker):
    real_spawn = pool._spawn
    spawned_in: list[int] = []

    def spawn():
        spawned_in.append(threading.get_ident())
        return real_spawn()

    mocker.patch.object(pool, "_spawn", spawn)
    os.kill(pool.pids[0], signal.SIGKILL)

    async def scenario() -> int:
        with pytest.raises(PreprocessPoolError):
            await pool.encode(card, "x", add_special_tokens=False)
        await wait_until_async(lambda: pool.state == "ready", deadline_s=DEADLINE_S)
        ok = await pool.encode(card, "ok", add_special_tokens=False)
        assert ok == build_chat_processor(card).encode_chat("ok")
        await pool.aclose()
        return threading.get_ident()

    loop_thread = asyncio.run(scenario())
    assert len(spawned_in) == 1 and spawned_in[0] != loop_thread


def test_a_failed_rebuild_turns_health_503_and_logs_one_error(pool, card, mocker, caplog):
    mocker.patch.object(
        pool, "_spawn", side_effect=PreprocessPoolError("preprocess workers failed to start")
    )

    async def scenario(service: Service):
        os.kill(pool.pids[0], signal.SIGKILL)
        wait_until(lambda: pool_child_dead(pool), deadline_s=DEADLINE_S, what="the child to die")
        first = await service.chat()
        await wait_until_async(lambda: pool.state == "failed", deadline_s=DEADLINE_S)
        return first, [await service.chat() for _ in range(3)], await service.health()

    first, later, health = asyncio.run(_serve(pool, card, scenario))
    assert first[0] == 503
    for status, body in later:
        assert status == 503 and body["error"]["code"] == "preprocess_unavailable"
        assert "down" in body["error"]["message"]
    assert health[0] == 503
    assert health[1]["status"] == "notready" and health[1]["preprocess_pool"] == "failed"
    assert not pool.healthy
    errors = _records(caplog, logging.ERROR, "")
    assert len(errors) == 1 and "Preprocess pool rebuild failed" in errors[0].getMessage()
    # Four failed requests, one cause: one WARNING (the budget holds back the rest).
    assert len(_records(caplog, logging.WARNING, "POST /v1/chat/completions -> 503")) == 1


def pool_child_dead(pool: PreprocessPool) -> bool:
    return not any(pid_alive(pid) for pid in pool.pids)


def test_a_worker_process_keeps_a_bounded_cache_of_tokenizers(tiny_tokenizer_dir, mocker):
    """In-process (the worker module's functions, as a pool process runs them)."""
    from dynamo.frontend.processors import preprocess_worker

    mocker.patch.object(preprocess_worker, "_tokenizers", type(preprocess_worker._tokenizers)())
    preprocess_worker.initialize_preprocess_worker(False, 0.0, logging.INFO, None)
    limit = preprocess_worker.CACHED_TOKENIZERS
    cards = [tiny_card(tiny_tokenizer_dir, f"m{i}") for i in range(limit + 2)]
    for card in cards:
        assert preprocess_worker.encode(card, "hi", False) == build_chat_processor(
            card
        ).encode_chat("hi")
    assert preprocess_worker.cached_models() == [f"m{i}" for i in range(2, limit + 2)]
    preprocess_worker.encode(cards[2], "again", False)  # used again: the newest now
    preprocess_worker.encode(cards[0], "back", False)  # reloaded: the oldest (m3) goes
    cached = preprocess_worker.cached_models()
    assert len(cached) == limit and cached[-2:] == ["m2", "m0"] and "m3" not in cached


def _parent_pid(pid: int) -> int:
    # /proc/<pid>/stat: "pid (comm) state ppid ..."; comm may hold spaces, so split after ")".
    with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
        return int(stat.read().rsplit(")", 1)[1].split()[1])


@pytest.mark.skipif(
    sys.version_info < (3, 14) or not sys.platform.startswith("linux"),
    reason="forkserver is the default start method on Linux from CPython 3.14",
)
@pytest.mark.parametrize("freeze", [True, False], ids=["freeze-on", "freeze-off"])
def test_with_3_14s_default_start_method_each_child_freezes_its_own_heap(freeze):
    """3.14 made forkserver the default: children are forked from a fresh server process, not
    from this one, so nothing this process froze reaches them and each child's freeze must be
    its own initializer's. This process freezes first (its freeze record is set); with the
    freeze off the children report none, with it on each reports its own count."""
    freeze_gc_heap(context="test parent")  # the autouse fixture unfreezes
    assert last_freeze() is not None
    pool = PreprocessPool(2, freeze_gc_heap=freeze, gc_pause_log_ms=0.0, start_method=None)
    assert pool.start_method == "forkserver"
    try:
        pids = pool.start()
        assert len(set(pids)) == 2 and os.getpid() not in pids
        # Forked by the forkserver, not by this process (spawn's children are this one's).
        assert all(_parent_pid(pid) != os.getpid() for pid in pids)
        if freeze:
            assert all(isinstance(count, int) and count > 0 for count in pool.frozen), pool.frozen
        else:
            assert pool.frozen == [None, None]
    finally:
        pool.shutdown()
    wait_until(lambda: not any(pid_alive(pid) for pid in pids), deadline_s=30, what="pool exit")


def test_the_pool_uses_spawn_unless_told_otherwise_and_refuses_fork(mocker):
    assert PreprocessPool(1, freeze_gc_heap=True, gc_pause_log_ms=0.0).start_method == "spawn"
    assert (
        PreprocessPool(1, freeze_gc_heap=True, gc_pause_log_ms=0.0, start_method="forkserver")
        .start_method == "forkserver"
    )  # fmt: skip
    with pytest.raises(ValueError, match="'fork'"):
        PreprocessPool(1, freeze_gc_heap=True, gc_pause_log_ms=0.0, start_method="fork")
    # Before 3.14 the platform's default on Linux is fork: None is refused there too.
    mocker.patch.object(
        multiprocessing, "get_all_start_methods", return_value=["fork", "spawn", "forkserver"]
    )
    with pytest.raises(ValueError, match="'fork'"):
        PreprocessPool(1, freeze_gc_heap=True, gc_pause_log_ms=0.0, start_method=None)
