"""A worker withdrawn for a GC maintenance, as the frontend sees it: the distinct 503 on the wire,
the router sending the request to another instance at once (no bench, no client error, bounded
attempts), the registry routing to withdrawn instances last, and the record's routing state as
peer input (validated, reported by both watchers as an update)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging

import pytest

from dynamo.frontend.processors.chat_processor import build_chat_processor
from dynamo.frontend.routing.model_registry import ModelEntry, ModelRegistry
from dynamo.runtime.discovery import ModelRecord
from dynamo.runtime.discovery.etcd_watcher import EtcdWatcher
from dynamo.runtime.discovery.file_store import DiscoveryStore
from dynamo.runtime.discovery.file_watcher import DiscoveryWatcher
from dynamo.runtime.discovery.record import InvalidRecord
from dynamo.runtime.request_plane import WITHDRAWN_MESSAGE
from tests.support.clock import FakeClock
from tests.support.frontend_fakes import MODEL, echo_worker
from tests.support.hostile_worker import hostile_worker, raw
from tests.support.routed_frontend import answer_of, chat, frontend, frontend_lines, run
from tests.support.tiny_model import tiny_card
from tests.support.watched import leased

WITHDRAWN = raw([json.dumps({"error": WITHDRAWN_MESSAGE, "withdrawn": True}).encode()], status=503)


@pytest.fixture
def card(tiny_tokenizer_dir):
    return build_chat_processor(tiny_card(tiny_tokenizer_dir, MODEL)).card


# -- the router ------------------------------------------------------------------------------------


def test_a_withdrawn_answer_sends_the_request_to_another_instance_without_a_bench(card, caplog):
    caplog.set_level(logging.INFO)

    async def scenario():
        async with (
            hostile_worker(WITHDRAWN) as withdrawn,
            echo_worker() as (_, live),
            frontend(card, withdrawn.endpoint, live) as (client, router),
        ):
            answers = [await answer_of(client, chat()) for _ in range(4)]
            assert [status for status, _ in answers] == [200] * 4
            # Round-robin: half the requests tried the withdrawn one first, once each.
            assert withdrawn.requests == 2 and withdrawn.health_probes == 0
            assert not router._benched

    run(scenario)
    assert not [line for line in frontend_lines(caplog) if "unavailable" in line]


def test_a_model_whose_instances_are_all_withdrawn_is_a_503_after_one_try_each(card):
    async def scenario():
        async with (
            hostile_worker(WITHDRAWN) as first,
            hostile_worker(WITHDRAWN) as second,
            frontend(card, first.endpoint, second.endpoint) as (client, router),
        ):
            status, body = await answer_of(client, chat())
            assert status == 503 and body["error"]["type"] == "service_unavailable_error"
            assert WITHDRAWN_MESSAGE not in json.dumps(body)  # the worker's words stay in logs
            assert (first.requests, second.requests) == (1, 1)
            assert not router._benched

    run(scenario)


def test_a_plain_503_still_benches_the_instance(card):
    async def scenario():
        draining = raw([b'{"error": "worker is draining"}'], status=503)
        async with (
            hostile_worker(draining) as worker,
            echo_worker() as (_, live),
            frontend(card, worker.endpoint, live) as (client, router),
        ):
            assert (await answer_of(client, chat()))[0] == 200
            assert len(router._benched) == 1

    run(scenario)


# -- the registry ----------------------------------------------------------------------------------


def entry_with(*records: ModelRecord) -> ModelEntry:
    return ModelEntry(name=MODEL, processor=None, instances={r.instance_id: r for r in records})  # type: ignore[arg-type]


def test_withdrawn_instances_are_routed_to_last_and_round_robin_goes_on():
    a, b, c = (ModelRecord(MODEL, f"http://127.0.0.1:{port}", f"i{port}") for port in (1, 2, 3))
    entry = entry_with(a, b, c)
    entry.instances[b.instance_id] = ModelRecord(
        MODEL, b.endpoint, b.instance_id, state="withdrawn"
    )
    orders = [[r.instance_id for r in entry.route_order()] for _ in range(3)]
    assert orders == [["i1", "i3", "i2"], ["i3", "i1", "i2"], ["i3", "i1", "i2"]]


def test_a_state_change_updates_the_instance_without_rebuilding_the_model(card, caplog):
    caplog.set_level(logging.INFO)
    builds: list = []

    def factory(model_card):
        builds.append(model_card)
        return build_chat_processor(model_card)

    async def scenario():
        registry = ModelRegistry(factory)
        first = ModelRecord(MODEL, "http://127.0.0.1:1", "i1", card=card)
        registry.add_instance(first)
        await registry.wait_idle()
        withdrawn = ModelRecord(MODEL, first.endpoint, "i1", card=card, state="withdrawn")
        registry.add_instance(withdrawn)
        entry = registry.get(MODEL)
        assert entry is not None and entry.instances == {"i1": withdrawn}
        registry.add_instance(first)
        assert entry.instances == {"i1": first} and registry.get(MODEL) is entry
        await registry.aclose()

    run(scenario)
    assert len(builds) == 1
    lines = frontend_lines(caplog)
    assert any(line.startswith("Model instance withdrawn: model=") for line in lines)
    assert any(line.startswith("Model instance serving again: model=") for line in lines)


# -- the record: peer input ------------------------------------------------------------------------


def record_json(**fields) -> str:
    base = {"model": MODEL, "endpoint": "http://127.0.0.1:8001", "instance_id": "i1"}
    return json.dumps({**base, **fields})


def test_the_routing_state_round_trips_and_only_known_values_are_read():
    record = ModelRecord(MODEL, "http://127.0.0.1:8001", "i1", state="withdrawn")
    assert ModelRecord.from_json(record.to_json()) == record and record.withdrawn
    assert "state" not in json.loads(ModelRecord(MODEL, record.endpoint, "i1").to_json())
    assert ModelRecord.from_json(record_json()).state is None
    for bad in ("draining", "WITHDRAWN", 1, "", ["withdrawn"], "x" * 10_000):
        with pytest.raises(InvalidRecord) as refused:
            ModelRecord.from_json(record_json(state=bad))
        assert refused.value.field == "state"


def test_the_file_watcher_reports_a_state_change_as_an_update(tmp_path):
    added: list[ModelRecord] = []
    removed: list[ModelRecord] = []
    watcher = DiscoveryWatcher(
        tmp_path, on_add=added.append, on_remove=removed.append, clock=FakeClock()
    )
    store = DiscoveryStore(tmp_path)
    record = leased("i1")
    for written in (
        record,
        dataclasses.replace(record, state="withdrawn", heartbeat=1),
        dataclasses.replace(record, heartbeat=2),  # back
        dataclasses.replace(record, heartbeat=3),  # a renewal: nothing to report
    ):
        store.register(written)
        asyncio.run(watcher.poll_once())
    assert [(r.instance_id, r.state) for r in added] == [
        ("i1", None),
        ("i1", "withdrawn"),
        ("i1", None),
    ]
    assert removed == []


def test_the_etcd_watcher_reports_a_state_change_as_an_update():
    added: list[ModelRecord] = []
    removed: list[ModelRecord] = []
    watcher = EtcdWatcher(None, "p/", on_add=added.append, on_remove=removed.append)  # type: ignore[arg-type]
    record = ModelRecord(MODEL, "http://127.0.0.1:8001", "i1")
    moved = ModelRecord(MODEL, "http://127.0.0.1:8002", "i1")

    async def scenario():
        await watcher._set(b"p/i1", record)
        await watcher._set(b"p/i1", ModelRecord(MODEL, record.endpoint, "i1", state="withdrawn"))
        await watcher._set(b"p/i1", record)
        await watcher._set(b"p/i1", moved)  # serves otherwise: removed, then added

    asyncio.run(scenario())
    assert [r.state for r in added[:3]] == [None, "withdrawn", None]
    assert removed == [record] and added[-1] == moved
    assert watcher.known == {"i1": moved}
