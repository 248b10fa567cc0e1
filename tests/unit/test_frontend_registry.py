"""The model registry and the discovery watcher feeding it, while the frontend serves."""

from __future__ import annotations

import asyncio
import gc
import logging

import pytest

from dynamo.common import lifecycle
from dynamo.frontend.chat_processor import build_chat_processor
from dynamo.frontend.model_registry import ModelRegistry
from dynamo.runtime.discovery import DiscoveryStore, DiscoveryWatcher, ModelRecord


def record(model: str, port: int) -> ModelRecord:
    return ModelRecord(model=model, endpoint=f"http://127.0.0.1:{port}")


@pytest.fixture
def factory(mocker):
    return mocker.Mock(side_effect=lambda model: build_chat_processor(model, merged_tokens=8))


def test_factory_runs_once_per_model_and_instances_take_turns(factory):
    registry = ModelRegistry(factory)
    a1, a2, b1 = record("a", 1001), record("a", 1002), record("b", 2001)
    for r in (a1, a2, b1):
        registry.add_instance(r)
    assert [call.args for call in factory.call_args_list] == [("a",), ("b",)]
    entry = registry.get("a")
    assert entry.processor.model == "a"
    orders = [entry.route_order() for _ in range(3)]
    assert [order[0] for order in orders] == [a1, a2, a1]  # round-robin first choice
    assert all(sorted(o, key=id) == sorted([a1, a2], key=id) for o in orders)  # every one, once


def test_last_instance_gone_drops_the_model(factory):
    registry = ModelRegistry(factory)
    a1, a2 = record("a", 1001), record("a", 1002)
    registry.add_instance(a1)
    registry.add_instance(a2)
    registry.remove_instance(a1)
    assert registry.get("a").route_order() == [a2]
    registry.remove_instance(a1)  # twice: no-op
    registry.remove_instance(record("never-seen", 1))
    registry.remove_instance(a2)
    assert registry.get("a") is None and registry.entries() == []
    registry.add_instance(a1)  # comes back: a fresh processor
    assert factory.call_count == 2


def test_a_failing_factory_publishes_no_half_made_model(mocker):
    registry = ModelRegistry(mocker.Mock(side_effect=RuntimeError("bad tokenizer")))
    with pytest.raises(RuntimeError):
        registry.add_instance(record("a", 1))
    assert registry.get("a") is None


def test_discovery_while_serving_builds_processors_without_collecting_or_freezing(
    tmp_path, mocker, caplog
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

    first, second = record("a", 1), record("b", 2)
    store.register(first)
    store.register(second)
    (tmp_path / "broken.json").write_text("{not json", encoding="utf-8")
    asyncio.run(watcher.poll_once())
    assert {e.name for e in registry.entries()} == {"a", "b"}
    store.unregister(first.instance_id)
    asyncio.run(watcher.poll_once())
    assert [e.name for e in registry.entries()] == ["b"]

    collect.assert_not_called()
    freeze.assert_not_called()
    assert "GC heap freeze" not in caplog.text  # neither a freeze nor a refused one
    assert "Ignoring malformed discovery record" in caplog.text
