"""The model registry and the discovery watcher feeding it, while the frontend serves.

Processors are the real `hf` ones on the tiny model's tokenizer; they are built in a thread, so
each test waits for the registry to be idle (a condition, not a sleep).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import threading
import weakref

import pytest
from aiohttp.test_utils import TestClient, TestServer

from dynamo.frontend.processors.chat_processor import ModelFilesError, build_chat_processor
from dynamo.frontend.routing.model_registry import REFUSAL_INTERVAL_S, REFUSAL_LINES, ModelRegistry
from dynamo.frontend.routing.worker_router import WorkerRouter, create_worker_session
from dynamo.frontend.serving.http_service import FrontendService
from dynamo.runtime.discovery.file_store import DiscoveryStore
from dynamo.runtime.discovery.file_watcher import DiscoveryWatcher
from dynamo.runtime.discovery.record import ModelRecord
from dynamo_gc import lifecycle
from tests.support import wait_until_async
from tests.support.clock import FakeClock
from tests.support.tiny_model import tiny_card


@pytest.fixture
def make_record(tiny_tokenizer_dir):
    def make(model: str, port: int, *, card=True, **card_fields) -> ModelRecord:
        return ModelRecord(
            model=model,
            endpoint=f"http://127.0.0.1:{port}",
            card=tiny_card(tiny_tokenizer_dir, model, **card_fields) if card else None,
        )

    return make


@pytest.fixture
def factory(mocker):
    return mocker.Mock(side_effect=build_chat_processor)


def run(scenario):
    return asyncio.run(scenario())


def warnings(caplog, text: str) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.WARNING and text in r.getMessage()
    ]


def test_factory_runs_once_per_model_and_instances_take_turns(factory, make_record):
    a1, a2, b1 = make_record("a", 1001), make_record("a", 1002), make_record("b", 2001)

    async def scenario():
        registry = ModelRegistry(factory)
        for r in (a1, a2, b1):
            registry.add_instance(r)
        assert registry.get("a") is None and registry.building == 2  # not served half-made
        await registry.wait_idle()
        return registry

    registry = run(scenario)
    assert [call.args[0].served_model_name for call in factory.call_args_list] == ["a", "b"]
    entry = registry.get("a")
    assert entry.processor.model == "a" and entry.card == a1.card
    orders = [entry.route_order() for _ in range(3)]
    assert [order[0] for order in orders] == [a1, a2, a1]  # round-robin first choice
    assert all(sorted(o, key=id) == sorted([a1, a2], key=id) for o in orders)  # every one, once


def test_last_instance_gone_drops_the_model_and_frees_its_processor(factory, make_record):
    a1, a2 = make_record("a", 1001), make_record("a", 1002)

    async def scenario():
        registry = ModelRegistry(factory)
        registry.add_instance(a1)
        registry.add_instance(a2)
        await registry.wait_idle()
        processor = weakref.ref(registry.get("a").processor)
        registry.remove_instance(a1)
        assert registry.get("a").route_order() == [a2]
        registry.remove_instance(a1)  # twice: no-op
        registry.remove_instance(make_record("never-seen", 1))
        registry.remove_instance(a2)
        assert registry.get("a") is None and registry.entries() == []
        # Nothing else holds it: its memory (the Rust tokenizer too) is returned by reference
        # counting, with no collection. The builder thread's finished work item may hold the
        # result for an instant after the loop got it (concurrent.futures drops it on its next
        # line), so wait for that, with a deadline: never a collection.
        await wait_until_async(lambda: processor() is None, deadline_s=5.0, poll_s=0.001)
        registry.add_instance(a1)  # comes back: a fresh processor
        await registry.wait_idle()
        return registry

    registry = run(scenario)
    assert registry.get("a") is not None and factory.call_count == 2


def test_a_record_without_a_card_is_refused_with_one_warning_naming_it(
    factory, make_record, caplog
):
    old = make_record("a", 1, card=False)

    async def scenario():
        registry = ModelRegistry(factory)
        registry.add_instance(old)
        registry.add_instance(old)  # the same instance seen again: no second line
        await registry.wait_idle()
        return registry

    registry = run(scenario)
    assert registry.get("a") is None and factory.call_count == 0
    (line,) = warnings(caplog, "has no model card")
    assert old.instance_id in line and old.endpoint in line


def test_a_failing_factory_publishes_nothing_and_warns_once(make_record, mocker, caplog):
    factory = mocker.Mock(side_effect=ModelFilesError("tokenizer.json does not exist"))
    first, second = make_record("a", 1), make_record("a", 2)

    async def scenario():
        registry = ModelRegistry(factory)
        registry.add_instance(first)
        await registry.wait_idle()
        registry.add_instance(second)  # the model is known broken: refused, once
        registry.add_instance(second)
        await registry.wait_idle()
        assert registry.get("a") is None and factory.call_count == 1
        # Once every refused instance has gone, a new record is tried again.
        registry.remove_instance(first)
        registry.remove_instance(second)
        registry.add_instance(make_record("a", 3))
        await registry.wait_idle()

    run(scenario)
    assert factory.call_count == 2
    assert len(warnings(caplog, "chat processor failed to build")) == 3  # two builds, one refusal


def test_the_model_limit_refuses_one_model_with_one_warning_then_admits_it(
    factory, make_record, caplog
):
    a, b, c = make_record("a", 1), make_record("b", 2), make_record("c", 3)

    async def scenario():
        registry = ModelRegistry(factory, max_models=2)
        for r in (a, b, c, c):
            registry.add_instance(r)
        await registry.wait_idle()
        served = sorted(e.name for e in registry.entries())
        registry.remove_instance(a)  # room for one: the waiting model is admitted
        await registry.wait_idle()
        return served, sorted(e.name for e in registry.entries())

    before, after = run(scenario)
    assert before == ["a", "b"] and after == ["b", "c"]
    (line,) = warnings(caplog, "--dyn-max-models / DYN_MAX_MODELS")
    assert "model=c" in line and "2 models" in line


def test_models_refused_for_a_failed_build_are_logged_within_a_budget(make_record, mocker, caplog):
    """A peer may register new model names without end, each with a template that does not
    compile (issue 37): the refusals are logged within the registry's budget for their kind
    (REFUSAL_LINES a minute), the next line counting the rest."""
    factory = mocker.Mock(side_effect=ModelFilesError("the chat template does not compile"))
    clock = FakeClock()

    async def scenario(names: list[str]) -> None:
        for name in names:
            registry.add_instance(make_record(name, 1))
        await registry.wait_idle()

    registry = ModelRegistry(factory, clock=clock)
    asyncio.run(scenario([f"m{i}" for i in range(15)]))
    assert factory.call_count == 15
    assert len(warnings(caplog, "chat processor failed to build")) == REFUSAL_LINES
    clock.advance(REFUSAL_INTERVAL_S)
    asyncio.run(scenario(["late"]))
    lines = warnings(caplog, "chat processor failed to build")
    assert len(lines) == REFUSAL_LINES + 1 and "model=late" in lines[-1]
    held_back = 15 - REFUSAL_LINES
    assert f"({held_back} more like it were not logged" in lines[-1]


def test_an_instance_with_another_card_is_refused(factory, make_record, caplog):
    good, other = make_record("a", 1), make_record("a", 2, context_length=64)

    async def scenario():
        registry = ModelRegistry(factory)
        registry.add_instance(good)
        registry.add_instance(other)  # while the first one builds
        await registry.wait_idle()
        return registry

    registry = run(scenario)
    assert list(registry.get("a").instances) == [good.instance_id]
    (line,) = warnings(caplog, "model card differs")
    assert other.instance_id in line


def test_an_instance_gone_while_its_processor_builds_leaves_nothing(make_record):
    release = threading.Event()

    def slow_factory(card):
        release.wait(30)
        return build_chat_processor(card)

    async def scenario():
        registry = ModelRegistry(slow_factory)
        record = make_record("a", 1)
        registry.add_instance(record)
        registry.remove_instance(record)
        release.set()
        await registry.wait_idle()
        return registry

    registry = run(scenario)
    assert registry.entries() == [] and registry.building == 0


def test_health_and_requests_are_answered_while_a_processor_builds(make_record):
    """The factory runs in a thread: a slow tokenizer load never blocks the event loop."""
    started, release = threading.Event(), threading.Event()

    def slow_factory(card):
        started.set()
        release.wait(30)
        return build_chat_processor(card)

    async def scenario():
        registry = ModelRegistry(slow_factory)
        session = create_worker_session()
        app = FrontendService(registry, WorkerRouter(session)).build_app()
        lifecycle.mark_serving("test")
        try:
            async with TestClient(TestServer(app, host="127.0.0.1")) as client:
                registry.add_instance(make_record("a", 1))
                await asyncio.to_thread(started.wait, 30)  # the build is under way, blocked
                health = await client.get("/health")
                body = {"model": "a", "messages": [{"role": "user", "content": "x"}]}
                not_yet = await client.post("/v1/chat/completions", json=body)
                during = (health.status, await health.json(), not_yet.status)
                release.set()
                await registry.wait_idle()
                after = await (await client.get("/v1/models")).json()
                return during, [m["id"] for m in after["data"]]
        finally:
            release.set()
            await session.close()

    during, models = run(scenario)
    # Answered at once, and not ready yet: the one model is still being built. A model being
    # loaded is known: its requests get 503 (retry), not 404 (no such model).
    status, health, chat_status = during
    assert (status, health["status"], health["models"], chat_status) == (503, "notready", 0, 503)
    assert "fewer than the 1" in health["reason"]
    assert models == ["a"]


def test_discovery_while_serving_builds_processors_without_collecting_or_freezing(
    tmp_path, mocker, caplog, make_record
):
    """The watcher and the factory run after mark_serving: no gc.collect, no freeze attempt."""
    store = DiscoveryStore(tmp_path)
    registry = ModelRegistry(build_chat_processor)
    watcher = DiscoveryWatcher(
        tmp_path, on_add=registry.add_instance, on_remove=registry.remove_instance
    )
    lifecycle.mark_serving("test")
    collect = mocker.patch.object(gc, "collect", wraps=gc.collect)
    freeze = mocker.patch.object(gc, "freeze", wraps=gc.freeze)
    caplog.set_level(logging.INFO)

    first, second = make_record("a", 1), make_record("b", 2)
    store.register(first)
    store.register(second)
    (tmp_path / "broken.json").write_text("{not json", encoding="utf-8")

    async def scenario():
        await watcher.poll_once()
        await registry.wait_idle()
        names = {e.name for e in registry.entries()}
        store.unregister(first.instance_id)
        await watcher.poll_once()
        return names, [e.name for e in registry.entries()]

    before, after = run(scenario)
    assert before == {"a", "b"} and after == ["b"]
    collect.assert_not_called()
    freeze.assert_not_called()
    assert "GC heap freeze" not in caplog.text  # neither a freeze nor a refused one
    assert "Ignoring malformed discovery record" in caplog.text
