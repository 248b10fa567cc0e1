"""Model discovery through a shared directory: atomic records, a watcher that never crashes.

The watcher is driven with ``poll_once`` (no sleeps); one test runs its own polling task and
waits on an event with a deadline.
"""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path

import pytest

from dynamo.runtime.discovery import file_backend as discovery
from dynamo.runtime.discovery.file_store import DiscoveryStore
from dynamo.runtime.discovery.file_watcher import DiscoveryWatcher
from dynamo.runtime.discovery.record import ModelRecord

LOGGER = "dynamo.runtime.discovery"


def _record(model: str = "m", instance_id: str = "i1", port: int = 40001) -> ModelRecord:
    return ModelRecord(model=model, endpoint=f"http://127.0.0.1:{port}", instance_id=instance_id)


class Recorder:
    """A watcher with its adds and removes recorded, polled by hand."""

    def __init__(self, directory: Path) -> None:
        self.added: list[ModelRecord] = []
        self.removed: list[ModelRecord] = []
        self.watcher = DiscoveryWatcher(
            directory, on_add=self.added.append, on_remove=self.removed.append
        )

    def poll(self) -> None:
        asyncio.run(self.watcher.poll_once())


def _watching(path: Path, text: str) -> Recorder:
    """``text`` written to ``path``, and a Recorder on its directory that has polled once."""
    path.write_text(text, encoding="utf-8")
    seen = Recorder(path.parent)
    seen.poll()
    return seen


def _warnings(caplog, path: Path) -> list[logging.LogRecord]:
    return [
        r
        for r in caplog.records
        if r.name.startswith(LOGGER)
        and r.levelno == logging.WARNING
        and str(path) in r.getMessage()
    ]


# --- records and the store ----------------------------------------------------------------


def test_record_round_trips_through_json():
    record = _record()
    assert ModelRecord.from_json(record.to_json()) == record
    data = json.loads(record.to_json())
    # Only what a frontend needs to route: no pid, no wall-clock times (informative fields a
    # peer could set to anything and nobody could check).
    assert set(data) == {"model", "endpoint", "instance_id"}


@pytest.mark.parametrize(
    "legacy",
    [{"pid": None}, {"pid": "abc"}, {"registered_at": {}}, {"heartbeat_at": [1]}, {"x": 1}],
)
def test_fields_a_frontend_does_not_need_are_ignored_whatever_they_hold(legacy):
    """Older workers wrote pid, registered_at and heartbeat_at; a newer one may add fields."""
    text = json.dumps({"model": "m", "endpoint": "http://x:1", "instance_id": "x", **legacy})
    assert ModelRecord.from_json(text) == ModelRecord("m", "http://x:1", "x")


def test_register_writes_one_whole_record_and_no_temp_file(tmp_path):
    store = DiscoveryStore(tmp_path / "discovery")  # created on first register
    record = _record()

    path = store.register(record)

    assert path == tmp_path / "discovery" / "i1.json"
    assert ModelRecord.from_json(path.read_text(encoding="utf-8")) == record
    assert sorted(p.name for p in path.parent.iterdir()) == ["i1.json"]
    assert store.read_all() == {"i1": record}


def test_unregister_removes_the_record_and_is_idempotent(tmp_path):
    store = DiscoveryStore(tmp_path)
    store.register(_record())
    store.unregister("i1")
    store.unregister("i1")
    store.unregister("never-registered")
    assert list(tmp_path.iterdir()) == []
    assert store.read_all() == {}


def test_a_failed_write_leaves_neither_a_record_nor_a_temp_file(tmp_path, mocker):
    store = DiscoveryStore(tmp_path)
    mocker.patch.object(discovery.os, "fsync", side_effect=OSError("disk full"))
    with pytest.raises(OSError, match="disk full"):
        store.register(_record())
    assert list(tmp_path.iterdir()) == []


def test_a_rewrite_is_atomic_readers_keep_the_old_record_until_the_replace(tmp_path, mocker):
    store = DiscoveryStore(tmp_path)
    old = _record(port=40001)
    path = store.register(old)
    mocker.patch.object(discovery.os, "replace", side_effect=OSError("interrupted"))

    with pytest.raises(OSError):
        store.register(_record(port=40002))

    assert ModelRecord.from_json(path.read_text(encoding="utf-8")) == old
    assert [p.name for p in tmp_path.iterdir()] == ["i1.json"]


def test_read_all_of_a_missing_directory_is_empty(tmp_path):
    assert DiscoveryStore(tmp_path / "nope").read_all() == {}


# --- the watcher --------------------------------------------------------------------------


def test_watcher_reports_adds_and_removals(tmp_path):
    store = DiscoveryStore(tmp_path)
    seen = Recorder(tmp_path)
    seen.poll()
    assert seen.added == [] and seen.removed == []

    first = _record(instance_id="a")
    store.register(first)
    seen.poll()
    seen.poll()  # nothing new: reported once
    assert seen.added == [first] and seen.removed == []

    second = _record(instance_id="b", port=40002)
    store.register(second)
    store.unregister("a")
    seen.poll()
    assert seen.added == [first, second]
    assert seen.removed == [first]
    assert set(seen.watcher.known) == {"b"}


def test_watcher_of_a_missing_directory_sees_nothing_and_does_not_crash(tmp_path):
    seen = Recorder(tmp_path / "not-yet")
    seen.poll()
    DiscoveryStore(tmp_path / "not-yet").register(_record())
    seen.poll()
    assert [r.instance_id for r in seen.added] == ["i1"]


def test_watcher_ignores_temp_hidden_and_foreign_files(tmp_path, caplog):
    (tmp_path / ".tmp-abc.part").write_text("{half", encoding="utf-8")
    (tmp_path / ".hidden.json").write_text("{half", encoding="utf-8")
    (tmp_path / "notes.txt").write_text("hello", encoding="utf-8")
    (tmp_path / "sub.json").mkdir()  # a directory named like a record
    seen = Recorder(tmp_path)
    seen.poll()
    assert seen.added == []
    assert not [
        r for r in caplog.records if ".tmp-" in r.getMessage() or ".hidden" in r.getMessage()
    ]


def _valid(instance_id: str) -> str:
    return _record(instance_id=instance_id).to_json()


MALFORMED = {
    "not-json": "{not json",
    "missing-fields": json.dumps({"model": "m"}),
    "empty-model": json.dumps({"model": "", "endpoint": "http://x", "instance_id": "x"}),
    "wrong-type": json.dumps({"model": 1, "endpoint": "http://x", "instance_id": "x"}),
    # Endpoints no request can reach: each failed every request routed to it, the first with a
    # 500 and a traceback (the resolver's IDNA codec), the second by meaning port 5.
    "endpoint-long-label": json.dumps(
        {"model": "m", "endpoint": "http://" + "a" * 64 + ":1", "instance_id": "x"}
    ),
    "endpoint-fullwidth-port": json.dumps(
        {"model": "m", "endpoint": "http://127.0.0.1:\uff15", "instance_id": "x"}
    ),
    "endpoint-not-http": json.dumps(
        {"model": "m", "endpoint": "file:///etc/passwd", "instance_id": "x"}
    ),
    "endpoint-not-a-url": json.dumps({"model": "m", "endpoint": "not a url", "instance_id": "x"}),
    # An instance id is the record's file name and etcd key: nothing that could name another.
    "instance-id-path": json.dumps({"model": "m", "endpoint": "http://x", "instance_id": "../x"}),
    "instance-id-newline": json.dumps(
        {"model": "m", "endpoint": "http://x", "instance_id": "x\ny"}
    ),
    "model-too-long": json.dumps({"model": "m" * 600, "endpoint": "http://x", "instance_id": "x"}),
    "heartbeat-text": json.dumps(
        {"model": "m", "endpoint": "http://x", "instance_id": "x", "heartbeat": "3"}
    ),
    "array": "[1, 2, 3]",
    "number": "42",
    "null": "null",
    "empty": "",
    "half-written": _valid("half-written")[: len(_valid("half-written")) // 2],
    "not-utf8": b"\xff\xfe{}".decode("latin-1"),
}


def test_malformed_records_are_ignored_with_one_warning_per_file_version(tmp_path, caplog):
    for name, text in MALFORMED.items():
        (tmp_path / f"{name}.json").write_bytes(text.encode("latin-1"))
    good = _record(instance_id="good")
    DiscoveryStore(tmp_path).register(good)
    seen = Recorder(tmp_path)

    seen.poll()
    seen.poll()
    seen.poll()

    assert seen.added == [good]
    for name in MALFORMED:
        assert len(_warnings(caplog, tmp_path / f"{name}.json")) == 1, name


def test_a_record_completed_later_is_picked_up_without_another_warning(tmp_path, caplog):
    path = tmp_path / "late.json"
    whole = _valid("late")
    seen = _watching(path, whole[: len(whole) // 2])  # a non-atomic writer, mid-write
    seen.poll()
    assert seen.added == []
    assert len(_warnings(caplog, path)) == 1

    path.write_text(whole, encoding="utf-8")
    seen.poll()

    assert [r.instance_id for r in seen.added] == ["late"]
    assert len(_warnings(caplog, path)) == 1


def test_a_new_bad_version_of_a_file_warns_again(tmp_path, caplog):
    path = tmp_path / "flaky.json"
    seen = _watching(path, "{bad")
    path.write_text("{still bad, and longer", encoding="utf-8")
    seen.poll()
    seen.poll()
    assert len(_warnings(caplog, path)) == 2


def test_a_bad_file_that_goes_away_and_comes_back_warns_again(tmp_path, caplog):
    path = tmp_path / "again.json"
    seen = _watching(path, "{bad")
    path.unlink()
    seen.poll()
    path.write_text("{bad", encoding="utf-8")
    seen.poll()
    assert len(_warnings(caplog, path)) == 2


def test_a_raising_callback_does_not_stop_the_watcher(tmp_path, caplog):
    store = DiscoveryStore(tmp_path)
    added: list[str] = []
    removed: list[str] = []

    def on_add(record: ModelRecord) -> None:
        added.append(record.instance_id)
        if record.instance_id == "a":
            raise RuntimeError("engine set-up failed")

    def on_remove(record: ModelRecord) -> None:
        removed.append(record.instance_id)
        raise RuntimeError("teardown failed")

    watcher = DiscoveryWatcher(tmp_path, on_add=on_add, on_remove=on_remove)
    store.register(_record(instance_id="a"))
    store.register(_record(instance_id="b"))
    asyncio.run(watcher.poll_once())
    assert added == ["a", "b"]  # "b" still reported after "a" raised

    store.unregister("a")
    store.register(_record(instance_id="c"))
    asyncio.run(watcher.poll_once())
    assert removed == ["a"]
    assert added == ["a", "b", "c"]  # "a" is not reported twice; "c" after a raising remove
    errors = [r for r in caplog.records if r.name.startswith(LOGGER) and r.levelno == logging.ERROR]
    assert len(errors) == 2 and all(r.exc_info for r in errors)


def test_coroutine_callbacks_are_awaited(tmp_path):
    added: list[str] = []

    async def on_add(record: ModelRecord) -> None:
        await asyncio.sleep(0)
        added.append(record.instance_id)

    async def on_remove(record: ModelRecord) -> None:
        raise RuntimeError("async failure is contained too")

    DiscoveryStore(tmp_path).register(_record())
    watcher = DiscoveryWatcher(tmp_path, on_add=on_add, on_remove=on_remove)

    async def scenario() -> None:
        await watcher.poll_once()
        DiscoveryStore(tmp_path).unregister("i1")
        await watcher.poll_once()

    asyncio.run(scenario())
    assert added == ["i1"]
    assert watcher.known == {}


def test_the_polling_task_reports_a_record_and_stops_cleanly(tmp_path):
    async def scenario() -> list[str]:
        seen = asyncio.Event()
        added: list[str] = []

        def on_add(record: ModelRecord) -> None:
            added.append(record.instance_id)
            seen.set()

        watcher = DiscoveryWatcher(
            tmp_path, on_add=on_add, on_remove=lambda r: None, poll_interval_s=0.01
        )
        task = watcher.start()
        DiscoveryStore(tmp_path).register(_record())
        await asyncio.wait_for(seen.wait(), timeout=30)
        await watcher.stop()
        await watcher.stop()  # idempotent
        assert task.done()
        return added

    assert asyncio.run(scenario()) == ["i1"]


@pytest.mark.parametrize(
    "endpoint",
    ["http://x", "http://w:1", "http://127.0.0.1:40001", "http://[::1]:5", "http://[fd00::1]",
     "http://worker-0.svc.cluster.local:8000/", "http://compose_worker_1:9000"],
)  # fmt: skip
def test_every_endpoint_a_worker_writes_is_read_back(endpoint):
    record = ModelRecord(model="m", endpoint=endpoint)
    assert ModelRecord.from_json(record.to_json()) == record


@pytest.mark.parametrize(
    "endpoint,reason",
    [
        ("http://" + "a" * 64 + ":1", "labels are 1-63 characters"),
        ("http://a..b:1", "not a valid host name"),
        ("http://127.0.0.1:\uff15", "ASCII"),
        ("http://127.0.0.1:\u0663", "ASCII"),
        ("http://h:+1", "[Pp]ort"),
        ("http://h:0", "port"),
        ("http://h:99999", "not a URL"),
        ("http://[zz]:1", "not a URL"),
        ("https://h:1", "must start with http://"),
        ("h:1", "must start with http://"),
        ("http://h:1/generate", "no path"),
        ("http://u@h:1", "no path, query or user"),
        ("http://h :1", "without blanks"),
        ("http://h\n:1", "control characters"),
    ],
)
def test_a_record_whose_endpoint_no_request_can_reach_is_malformed(endpoint, reason):
    text = ModelRecord(model="m", endpoint=endpoint).to_json()
    with pytest.raises(ValueError, match=reason.replace("+", r"\+")):
        ModelRecord.from_json(text)
