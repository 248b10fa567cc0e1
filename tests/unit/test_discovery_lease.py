"""The discovery lease: workers renew their record, the watcher drops a record that stops changing.

The watcher is driven with ``poll_once`` and an injected clock (no sleeps, no real time); the
heartbeat task runs on a real loop and is waited on with deadlines.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
from pathlib import Path

import pytest

from dynamo.runtime.discovery import file_backend as discovery
from dynamo.runtime.discovery import open_discovery
from dynamo.runtime.discovery.file_backend import RecordHeartbeat, heartbeat_interval_for
from dynamo.runtime.discovery.file_store import DiscoveryStore
from dynamo.runtime.discovery.record import ModelRecord
from dynamo.vllm import backend_args, engine_factory
from dynamo.vllm import main as worker_main
from tests.support import wait_until_async
from tests.support.tiny_model import mock_worker_env
from tests.support.watched import TTL_S, Watched, leased, registered_and_watched

LOGGER = "dynamo.runtime.discovery"
EXPIRED = (
    "Discovery record {path} expired: no heartbeat for {silent} s (worker {instance} at {endpoint})"
)


def _warnings(caplog, text: str) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name.startswith(LOGGER) and r.levelno == logging.WARNING and text in r.getMessage()
    ]


# --- the record and the store -------------------------------------------------------------


def test_a_leased_record_round_trips_and_an_unleased_one_keeps_the_old_shape():
    record = leased()
    assert ModelRecord.from_json(record.to_json()) == record
    assert record.has_lease
    plain = ModelRecord(model="m", endpoint="http://x", instance_id="p")
    assert not plain.has_lease
    assert set(json.loads(plain.to_json())) == {"model", "endpoint", "instance_id"}


def test_a_record_written_before_leases_existed_is_read_without_a_lease():
    old = json.dumps({"model": "m", "endpoint": "http://x", "instance_id": "old", "pid": 7})
    record = ModelRecord.from_json(old)
    assert record.heartbeat is None and record.heartbeat_interval_s is None
    assert not record.has_lease


def test_renew_rewrites_atomically_with_the_counter_incremented(tmp_path):
    store = DiscoveryStore(tmp_path)
    path = store.register(leased())

    first = store.renew(leased())
    second = store.renew(first)

    assert (first.heartbeat, second.heartbeat) == (1, 2)
    assert ModelRecord.from_json(path.read_text(encoding="utf-8")) == second
    assert [p.name for p in tmp_path.iterdir()] == ["i1.json"]  # no temp file left


def test_a_failed_renewal_keeps_the_previous_record_whole(tmp_path, mocker):
    store = DiscoveryStore(tmp_path)
    path = store.register(leased())
    before = path.read_text(encoding="utf-8")
    mocker.patch.object(discovery.os, "replace", side_effect=OSError("volume gone"))
    with pytest.raises(OSError):
        store.renew(leased())
    assert path.read_text(encoding="utf-8") == before
    assert [p.name for p in tmp_path.iterdir()] == ["i1.json"]


def test_the_heartbeat_interval_leaves_room_for_missed_beats():
    assert heartbeat_interval_for(10.0) == 2.0
    assert heartbeat_interval_for(TTL_S) * 2 < TTL_S


# --- the watcher's lease ------------------------------------------------------------------


def test_a_record_unchanged_for_longer_than_the_ttl_expires_with_one_warning(tmp_path, caplog):
    store = DiscoveryStore(tmp_path)
    path = store.register(leased())
    seen = Watched(tmp_path)
    seen.poll()
    assert seen.added == ["i1"]

    seen.clock.advance(TTL_S)  # exactly the TTL: still alive
    seen.poll()
    assert seen.removed == [] and seen.live() == {"i1"}

    seen.clock.advance(0.5)
    seen.poll()
    seen.clock.advance(60.0)
    seen.poll()  # still expired: no second removal, no second warning

    assert seen.removed == ["i1"] and seen.live() == set()
    assert _warnings(caplog, "expired") == [
        EXPIRED.format(path=path, silent="10.5", instance="i1", endpoint="http://127.0.0.1:40001")
    ]


def test_renewals_keep_a_record_alive_over_many_ttls(tmp_path, caplog):
    store = DiscoveryStore(tmp_path)
    record = leased()
    store.register(record)
    seen = Watched(tmp_path)
    for _ in range(50):  # 50 polls 0.9 TTL apart: 45 TTLs
        seen.poll()
        seen.clock.advance(0.9 * TTL_S)
        record = store.renew(record)
    seen.poll()
    assert seen.added == ["i1"] and seen.removed == []
    assert _warnings(caplog, "expired") == []


def test_a_frontend_that_stalled_longer_than_the_ttl_keeps_a_record_that_changed(tmp_path):
    """Only "did it change since I last looked": the watcher's own pause is no expiry."""
    record = leased()
    store, seen = registered_and_watched(tmp_path, record)
    store.renew(record)  # the worker beat while the frontend was not polling
    seen.clock.advance(5 * TTL_S)
    seen.poll()
    assert seen.removed == [] and seen.live() == {"i1"}


def test_an_expired_record_that_changes_again_is_added_again(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger=LOGGER)
    record = leased()
    store, seen = registered_and_watched(tmp_path, record)
    path = store.path_for(record.instance_id)
    seen.clock.advance(TTL_S + 1)
    seen.poll()
    assert seen.removed == ["i1"]

    store.renew(record)  # the worker was only stalled
    seen.poll()
    assert seen.added == ["i1", "i1"] and seen.live() == {"i1"}
    assert f"Discovery record {path} renewed after it expired" in caplog.text

    seen.clock.advance(TTL_S + 1)  # and it can expire again
    seen.poll()
    assert seen.removed == ["i1", "i1"]
    assert len(_warnings(caplog, "expired")) == 2


def test_a_record_without_a_lease_never_expires(tmp_path, caplog):
    DiscoveryStore(tmp_path).register(ModelRecord(model="m", endpoint="http://x", instance_id="o"))
    seen = Watched(tmp_path)
    seen.poll()
    seen.clock.advance(1000 * TTL_S)
    seen.poll()
    assert seen.added == ["o"] and seen.removed == []
    assert _warnings(caplog, "expired") == []


def test_only_the_silent_record_expires(tmp_path):
    store = DiscoveryStore(tmp_path)
    alive, dead = leased("alive", 40001), leased("dead", 40002)
    store.register(alive)
    store.register(dead)
    seen = Watched(tmp_path)
    seen.poll()
    for _ in range(3):
        seen.clock.advance(0.6 * TTL_S)
        alive = store.renew(alive)
        seen.poll()
    assert seen.removed == ["dead"] and seen.live() == {"alive"}


def test_a_removed_and_rewritten_record_starts_a_fresh_lease(tmp_path):
    record = leased()
    store, seen = registered_and_watched(tmp_path, record)
    seen.clock.advance(0.9 * TTL_S)
    store.unregister("i1")
    seen.poll()
    store.register(record)  # same content as before: still a new sighting
    seen.poll()
    seen.clock.advance(0.9 * TTL_S)
    seen.poll()
    assert seen.added == ["i1", "i1"] and seen.removed == ["i1"]


def test_the_ttl_is_never_shorter_than_two_of_the_writers_intervals(tmp_path):
    """A frontend with a shorter TTL than its workers' must not drop them between beats."""
    store = DiscoveryStore(tmp_path)
    store.register(leased(interval_s=4.0))  # the worker renews every 4 s
    seen = Watched(tmp_path, ttl_s=2.0)
    seen.poll()
    seen.clock.advance(7.9)
    seen.poll()
    assert seen.removed == []
    seen.clock.advance(0.2)
    seen.poll()
    assert seen.removed == ["i1"]


LEASE_MALFORMED = {
    "heartbeat-text": {"heartbeat": "abc"},
    "heartbeat-infinite": {"heartbeat": float("inf")},
    "heartbeat-object": {"heartbeat": {}},
    "interval-negative": {"heartbeat": 0, "heartbeat_interval_s": -1},
    "interval-zero": {"heartbeat": 0, "heartbeat_interval_s": 0},
    "interval-nan": {"heartbeat": 0, "heartbeat_interval_s": float("nan")},
    "heartbeat-numeric-text": {"heartbeat": "0"},
}


def test_malformed_records_are_still_warned_once_as_time_passes(tmp_path, caplog):
    base = {"model": "m", "endpoint": "http://x"}
    for name, fields in LEASE_MALFORMED.items():
        text = json.dumps({**base, "instance_id": name, **fields})
        (tmp_path / f"{name}.json").write_text(text, encoding="utf-8")
    (tmp_path / "junk.json").write_text("{half", encoding="utf-8")
    DiscoveryStore(tmp_path).register(leased("good"))
    seen = Watched(tmp_path)

    for _ in range(3):
        seen.poll()
        seen.clock.advance(TTL_S)  # malformed records neither expire nor warn again

    assert seen.added == ["good"]
    for name in [*LEASE_MALFORMED, "junk"]:
        path = tmp_path / f"{name}.json"
        assert len(_warnings(caplog, f"Ignoring malformed discovery record {path}")) == 1, name
    assert len(_warnings(caplog, "expired")) == 1  # only "good", which nobody renewed


# --- the worker's heartbeat task ----------------------------------------------------------


def _on_disk(path: Path) -> ModelRecord:
    return ModelRecord.from_json(path.read_text(encoding="utf-8"))


def test_the_heartbeat_task_renews_the_record_until_stopped(tmp_path):
    store = DiscoveryStore(tmp_path)
    record = leased(interval_s=0.01)
    path = store.register(record)

    async def scenario() -> None:
        heartbeat = RecordHeartbeat(store, record, interval_s=0.01)
        task = heartbeat.start()
        await wait_until_async(lambda: (_on_disk(path).heartbeat or 0) >= 3, deadline_s=30)
        await heartbeat.stop()
        await heartbeat.stop()  # idempotent
        assert task.cancelled()
        assert _on_disk(path) == heartbeat.record  # the last renewal is the one on disk

    asyncio.run(scenario())


def test_failed_heartbeats_warn_once_and_the_next_success_says_so(tmp_path, mocker, caplog):
    caplog.set_level(logging.INFO, logger=LOGGER)
    store = DiscoveryStore(tmp_path)
    record = leased()
    path = store.register(record)
    heartbeat = RecordHeartbeat(store, record, interval_s=2.0)
    real_renew = store.renew
    renew = mocker.patch.object(store, "renew", side_effect=OSError("volume gone"))

    heartbeat.beat()
    heartbeat.beat()
    heartbeat.beat()
    assert renew.call_count == 3
    assert len(_warnings(caplog, "Discovery heartbeat failed")) == 1
    assert _on_disk(path).heartbeat == 0

    renew.side_effect = real_renew
    heartbeat.beat()
    assert _on_disk(path).heartbeat == 1
    assert "Discovery heartbeat restored (heartbeat=1)" in caplog.text
    renew.side_effect = OSError("again")
    heartbeat.beat()
    assert len(_warnings(caplog, "Discovery heartbeat failed")) == 2


def test_the_worker_renews_its_record_while_serving_and_stops_before_removing_it(tmp_path, mocker):
    """On the real run_worker: heartbeats while serving; on drain the task ends, then the record."""
    discovery_dir = tmp_path / "discovery"
    config = backend_args.parse_args(
        ["--discovery-dir", str(discovery_dir), "--discovery-ttl", "1", "--no-freeze-gc-heap"],
        env=mock_worker_env(),
    )
    heartbeats_running_at_removal: list[list[asyncio.Task]] = []
    real_unregister = DiscoveryStore.unregister

    def unregister(store, instance_id):
        running = [t for t in asyncio.all_tasks() if t.get_name() == "discovery-heartbeat"]
        heartbeats_running_at_removal.append(running)
        real_unregister(store, instance_id)

    mocker.patch.object(DiscoveryStore, "unregister", unregister)

    def beating(worker: asyncio.Future) -> ModelRecord | None:
        if worker.done():
            worker.result()  # a worker that failed to start fails the test now, with its error
            raise AssertionError("the worker stopped before renewing its record")
        records = DiscoveryStore(discovery_dir).read_all()
        if records:
            (record,) = records.values()
            if (record.heartbeat or 0) >= 3:
                return record
        return None

    async def scenario() -> tuple[int, ModelRecord]:
        worker = asyncio.ensure_future(
            worker_main.run_worker(
                config, open_discovery(config.discovery), engine_factory.prepare_engine(config)
            )
        )
        record = await wait_until_async(lambda: beating(worker), deadline_s=30)
        os.kill(os.getpid(), signal.SIGTERM)  # handled by the worker's loop: the drain
        return await asyncio.wait_for(worker, 30), record

    exit_code, record = asyncio.run(scenario())

    assert exit_code == 0
    assert record.heartbeat_interval_s == heartbeat_interval_for(1.0) == 0.2
    assert heartbeats_running_at_removal == [[]]  # stopped before the record was removed
    assert list(discovery_dir.iterdir()) == []  # and no late renewal wrote it back
