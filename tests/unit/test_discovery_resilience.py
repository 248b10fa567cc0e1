"""The discovery watcher and heartbeat on a file system that misbehaves, and off the event loop.

A directory that cannot be listed or a record that cannot be read is "unknown", not "gone": the
watcher keeps what it knew, warns once per distinct error and never dies. File-system work runs
in a worker thread; callbacks stay on the loop. Unchanged records are not re-read; long-expired
ones are deleted, never a live one. The watcher is driven with ``poll_once`` on an injected
clock; the tasks run on a real loop and are waited on with deadlines.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from pathlib import Path

import pytest

from dynamo.runtime.discovery import file_watcher as discovery
from dynamo.runtime.discovery.file_backend import RecordHeartbeat
from dynamo.runtime.discovery.file_store import DiscoveryStore, ensure_discovery_dir
from dynamo.runtime.discovery.file_watcher import (
    DELETE_AFTER_TTLS,
    REREAD_EVERY_TTLS,
    DiscoveryWatcher,
)
from dynamo.runtime.discovery.interface import DiscoveryDirError
from dynamo.runtime.discovery.periodic import PeriodicTask
from dynamo.runtime.discovery.record import ModelRecord
from tests.support import wait_until_async
from tests.support.watched import TTL_S, Watched, leased, registered_and_watched

LOGGER = "dynamo.runtime.discovery"
DEADLINE_S = 30.0


def _logged(caplog, text: str, level: int = logging.WARNING) -> list[logging.LogRecord]:
    return [
        r
        for r in caplog.records
        if r.name.startswith(LOGGER) and r.levelno == level and text in r.getMessage()
    ]


# --- start-up check -----------------------------------------------------------------------


def test_ensure_discovery_dir_creates_a_missing_directory(tmp_path):
    path = tmp_path / "a" / "b"
    assert ensure_discovery_dir(path) == path
    assert path.is_dir()
    assert ensure_discovery_dir(path) == path  # an existing directory is fine too


def test_ensure_discovery_dir_refuses_a_file_and_a_path_under_a_file(tmp_path):
    a_file = tmp_path / "records"
    a_file.write_text("not a directory")
    with pytest.raises(DiscoveryDirError, match=f"{a_file} exists and is not a directory"):
        ensure_discovery_dir(a_file)
    with pytest.raises(DiscoveryDirError, match="cannot create"):
        ensure_discovery_dir(a_file / "sub")


def test_ensure_discovery_dir_refuses_a_directory_it_cannot_list(tmp_path, mocker):
    # Tests may run as root, which chmod cannot lock out: the listing itself is made to fail.
    mocker.patch.object(
        discovery.os, "scandir", side_effect=PermissionError(13, "Permission denied")
    )
    with pytest.raises(DiscoveryDirError, match=f"cannot list {tmp_path}: Permission denied"):
        ensure_discovery_dir(tmp_path)


# --- an unreadable directory or record ----------------------------------------------------


def test_an_unlistable_directory_keeps_the_known_records_and_warns_once_per_error(
    tmp_path, mocker, caplog
):
    caplog.set_level(logging.INFO, logger=LOGGER)
    store = DiscoveryStore(tmp_path)
    store.register(leased("a", 40001))
    store.register(leased("b", 40002))
    seen = Watched(tmp_path)
    seen.poll()
    assert seen.live() == {"a", "b"}

    real_scandir = os.scandir
    scandir = mocker.patch.object(
        discovery.os, "scandir", side_effect=PermissionError(13, "Permission denied")
    )
    for _ in range(3):
        seen.clock.advance(TTL_S)  # three TTLs without a look: still nothing expires
        seen.poll()
    scandir.side_effect = OSError(5, "Input/output error")  # a different error warns again
    seen.poll()
    seen.poll()

    assert scandir.call_count == 5
    assert seen.live() == {"a", "b"} and seen.removed == []
    warnings = _logged(caplog, "Cannot list the discovery directory")
    assert [("Permission denied" in w.getMessage(), "Input/output" in w.getMessage())
            for w in warnings] == [(True, False), (False, True)]  # fmt: skip
    assert _logged(caplog, "expired") == []

    # Readable again: one INFO, and each lease gets a fresh TTL (renewals were not seen).
    scandir.side_effect = real_scandir
    seen.poll()
    assert seen.live() == {"a", "b"}
    assert len(_logged(caplog, "readable again: leases restart from now", logging.INFO)) == 1
    a = leased("a", 40001)
    for _ in range(2):  # "a" renews, "b" is dead: only "b" expires, one TTL after recovery
        seen.clock.advance(0.6 * TTL_S)
        a = store.renew(a)
        seen.poll()
    assert seen.live() == {"a"} and seen.removed == ["b"]


def test_an_unreadable_record_keeps_its_last_known_state_and_warns_once(tmp_path, mocker, caplog):
    store = DiscoveryStore(tmp_path)
    path = store.register(leased())
    seen = Watched(tmp_path)
    seen.poll()
    assert seen.live() == {"i1"}

    real_read = discovery.read_record_file

    def flaky_read(file):
        if Path(file) == path:
            raise PermissionError(13, "Permission denied", str(file))
        return real_read(file)

    mocker.patch.object(discovery, "read_record_file", flaky_read)
    store.renew(leased())  # a new version, so the watcher must read it, and cannot
    for _ in range(3):
        seen.poll()
    assert seen.live() == {"i1"} and seen.removed == []
    assert len(_logged(caplog, f"Cannot read discovery record {path}")) == 1
    assert _logged(caplog, "Ignoring malformed") == []

    # If it stays unreadable, its lease runs out like any silent record's.
    seen.clock.advance(TTL_S + 1)
    seen.poll()
    assert seen.removed == ["i1"]


def test_the_polling_task_survives_an_unexpected_error_and_logs_it_once(tmp_path, mocker, caplog):
    caplog.set_level(logging.INFO, logger=LOGGER)
    DiscoveryStore(tmp_path).register(leased())
    added: list[str] = []
    watcher = DiscoveryWatcher(
        tmp_path, on_add=lambda r: added.append(r.instance_id), on_remove=lambda r: None,
        poll_interval_s=0.001,
    )  # fmt: skip
    real_poll_files = watcher._poll_files
    calls = 0

    def broken_three_times():
        nonlocal calls
        calls += 1
        if calls <= 3:
            raise RuntimeError("a bug in the scan")
        return real_poll_files()

    mocker.patch.object(watcher, "_poll_files", broken_three_times)

    async def scenario() -> asyncio.Task:
        task = watcher.start()
        await wait_until_async(lambda: added == ["i1"], deadline_s=DEADLINE_S)
        assert not task.done()
        await watcher.stop()
        return task

    task = asyncio.run(scenario())
    assert task.cancelled()
    errors = _logged(caplog, "discovery-watcher: step failed", logging.ERROR)
    assert len(errors) == 1 and errors[0].exc_info is not None
    assert "RuntimeError: a bug in the scan" in errors[0].getMessage()
    assert len(_logged(caplog, "running again after 3 failed step(s)", logging.INFO)) == 1


# --- off the event loop -------------------------------------------------------------------


def test_file_system_work_runs_in_a_thread_and_callbacks_on_the_loop(tmp_path, mocker):
    store = DiscoveryStore(tmp_path)
    threads: dict[str, set[int]] = {"scan": set(), "on_add": set(), "renew": set()}
    real_scan, real_renew = DiscoveryWatcher._scan, store.renew

    def scan(self):
        threads["scan"].add(threading.get_ident())
        return real_scan(self)

    def renew(record):
        threads["renew"].add(threading.get_ident())
        return real_renew(record)

    mocker.patch.object(DiscoveryWatcher, "_scan", scan)
    mocker.patch.object(store, "renew", renew)
    record = leased()
    store.register(record)

    async def scenario() -> int:
        watcher = DiscoveryWatcher(
            tmp_path,
            on_add=lambda r: threads["on_add"].add(threading.get_ident()),
            on_remove=lambda r: None,
            poll_interval_s=0.001,
        )
        heartbeat = RecordHeartbeat(store, record, interval_s=0.001)
        watcher.start()
        heartbeat.start()
        await wait_until_async(
            lambda: threads["on_add"] and len(threads["renew"]) >= 1, deadline_s=DEADLINE_S
        )
        await heartbeat.stop()
        await watcher.stop()
        return threading.get_ident()

    loop_thread = asyncio.run(scenario())
    assert threads["on_add"] == {loop_thread}
    assert threads["scan"] and loop_thread not in threads["scan"]
    assert threads["renew"] and loop_thread not in threads["renew"]


def test_stopping_the_heartbeat_waits_for_a_renewal_in_progress(tmp_path, mocker):
    """stop() returning means no write is pending: the worker removes its record next."""
    store = DiscoveryStore(tmp_path)
    record = leased()
    path = store.register(record)
    entered, release = threading.Event(), threading.Event()
    real_renew = store.renew
    finished: list[int] = []

    def slow_renew(current):
        entered.set()
        release.wait(DEADLINE_S)  # a volume that takes its time
        renewed = real_renew(current)
        finished.append(renewed.heartbeat)
        return renewed

    mocker.patch.object(store, "renew", slow_renew)

    async def scenario() -> tuple[bool, bool]:
        heartbeat = RecordHeartbeat(store, record, interval_s=0.001)
        task = heartbeat.start()
        await wait_until_async(entered.is_set, deadline_s=DEADLINE_S)
        stopping = asyncio.ensure_future(heartbeat.stop())
        await asyncio.sleep(0.05)  # give a wrong stop() the chance to return early
        returned_early = stopping.done()
        release.set()
        await asyncio.wait_for(stopping, DEADLINE_S)
        return returned_early, task.cancelled()

    returned_early, cancelled = asyncio.run(scenario())
    assert not returned_early and cancelled
    assert finished == [1]  # the one renewal in progress completed, and no other started
    store.unregister(record.instance_id)
    assert not path.exists()


def test_a_periodic_task_stopped_from_a_cancelled_task_propagates_only_its_own_cancel():
    async def scenario() -> bool:
        ticks = 0

        async def step() -> None:
            nonlocal ticks
            ticks += 1

        periodic = PeriodicTask("ticker", 0.001, step)
        periodic.start()
        await wait_until_async(lambda: ticks >= 2, deadline_s=DEADLINE_S)
        await periodic.stop()
        await periodic.stop()  # idempotent
        stopped_at = ticks
        await asyncio.sleep(0.01)
        return ticks == stopped_at

    assert asyncio.run(scenario())


# --- unchanged records are not re-read ----------------------------------------------------


def test_an_unchanged_record_is_not_re_read_until_the_reread_interval(tmp_path, mocker):
    store = DiscoveryStore(tmp_path)
    record = leased()
    path = store.register(record)
    seen = Watched(tmp_path)
    real_read = discovery.read_record_file
    reads: list[Path] = []

    def counting_read(file):
        reads.append(Path(file))
        return real_read(file)

    mocker.patch.object(discovery, "read_record_file", counting_read)
    seen.poll()
    for _ in range(5):
        seen.clock.advance(REREAD_EVERY_TTLS * TTL_S / 10)
        seen.poll()
    assert reads == [path]  # read once, then stat said "unchanged"

    store.renew(record)  # a new inode (atomic replace) and a new counter
    seen.poll()
    assert reads == [path, path]

    seen.clock.advance(REREAD_EVERY_TTLS * TTL_S)  # a stale stat cache must not hide renewals
    seen.poll()
    assert reads == [path, path, path]
    assert seen.live() == {"i1"}


def test_lease_expiry_still_works_with_the_stat_cache(tmp_path):
    record = leased()
    store, seen = registered_and_watched(tmp_path, record)
    for _ in range(20):  # renewals every 0.3 TTL: never expires
        seen.clock.advance(0.3 * TTL_S)
        record = store.renew(record)
        seen.poll()
    assert seen.removed == []
    seen.clock.advance(TTL_S + 0.5)
    seen.poll()
    assert seen.removed == ["i1"]


# --- deleting long-expired records --------------------------------------------------------


def test_a_record_expired_for_many_ttls_is_deleted_once(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger=LOGGER)
    store = DiscoveryStore(tmp_path)
    path = store.register(leased())
    seen = Watched(tmp_path)
    seen.poll()
    seen.clock.advance(TTL_S + 1)
    seen.poll()
    assert seen.removed == ["i1"] and path.exists()  # expired, not yet deleted

    seen.clock.advance((DELETE_AFTER_TTLS - 1) * TTL_S - 2)  # 10 TTLs silent, not more
    seen.poll()
    assert path.exists()
    seen.clock.advance(1.5)
    seen.poll()
    seen.poll()
    assert not path.exists()
    assert seen.removed == ["i1"]  # removed once, at expiry
    assert len(_logged(caplog, f"Deleted discovery record {path}", logging.INFO)) == 1


def test_a_worker_that_renews_after_its_record_was_deleted_is_listed_again(tmp_path):
    record = leased()
    store, seen = registered_and_watched(tmp_path, record)
    path = store.path_for(record.instance_id)
    seen.clock.advance(DELETE_AFTER_TTLS * TTL_S + 1)
    seen.poll()
    assert not path.exists()
    store.renew(record)  # the worker was only stalled: its renewal writes the whole record
    seen.poll()
    assert seen.live() == {"i1"} and seen.added == ["i1", "i1"]


def test_a_record_that_changed_since_it_was_read_is_not_deleted(tmp_path, mocker):
    record = leased()
    store, seen = registered_and_watched(tmp_path, record)
    path = store.path_for(record.instance_id)
    seen.clock.advance(DELETE_AFTER_TTLS * TTL_S + 1)
    # The worker renews between the watcher's read and its delete.
    real_collect = DiscoveryWatcher._collect

    def renew_first(self, *args):
        store.renew(record)
        return real_collect(self, *args)

    mocker.patch.object(DiscoveryWatcher, "_collect", renew_first)
    seen.poll()
    assert path.exists()
    mocker.stopall()
    seen.poll()
    assert seen.live() == {"i1"}


def test_records_without_a_lease_are_never_deleted_nor_with_deletion_off(tmp_path):
    store = DiscoveryStore(tmp_path)
    plain = store.register(ModelRecord(model="m", endpoint="http://x", instance_id="plain"))
    with_lease = store.register(leased("leased"))
    seen = Watched(tmp_path, delete_after_ttls=None)
    seen.poll()
    seen.clock.advance(1000 * TTL_S)
    seen.poll()
    assert plain.exists() and with_lease.exists()
    assert seen.live() == {"plain"}

    other = Watched(tmp_path)
    other.poll()
    other.clock.advance(1000 * TTL_S)
    other.poll()
    assert plain.exists() and not with_lease.exists()


def test_a_quiet_reader_deletes_nothing_and_logs_only_at_debug(tmp_path, caplog):
    """A worker's view of its peers (``quiet``): the expired and malformed records the frontends
    report and clean up are seen the same way, but nothing is deleted and nothing is said above
    DEBUG (each worker would otherwise repeat every frontend's lines)."""
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    store = DiscoveryStore(tmp_path)
    expired = store.register(leased("gone"))
    live = leased("live", port=40002)
    store.register(live)
    malformed = tmp_path / "junk.json"
    malformed.write_text("{not json")
    quiet = Watched(tmp_path, quiet=True)
    quiet.poll()
    assert quiet.live() == {"gone", "live"}
    for _ in range(2):  # the live one renews, the other is silent for many TTLs
        quiet.clock.advance(DELETE_AFTER_TTLS * TTL_S)
        live = store.renew(live)
        quiet.poll()
    assert quiet.live() == {"live"} and quiet.removed == ["gone"]
    assert expired.exists() and malformed.exists()
    lines = [r for r in caplog.records if r.name.startswith(LOGGER)]
    assert {r.levelno for r in lines} == {logging.DEBUG}
    said = " ".join(r.getMessage() for r in lines)
    assert "expired" in said and "malformed" in said

    caplog.clear()  # a frontend's watcher says both, and deletes the long-expired record
    frontend = Watched(tmp_path)
    frontend.poll()
    frontend.clock.advance(DELETE_AFTER_TTLS * TTL_S + 1)
    frontend.poll()
    assert not expired.exists()
    assert _logged(caplog, "Ignoring malformed discovery record")
    assert _logged(caplog, "expired: no heartbeat")


def test_a_failed_delete_warns_once_and_is_not_retried(tmp_path, mocker, caplog):
    store = DiscoveryStore(tmp_path)
    first = store.register(leased("a", 40001))
    second = store.register(leased("b", 40002))
    seen = Watched(tmp_path)
    seen.poll()
    unlink = mocker.patch.object(
        discovery.os, "unlink", side_effect=OSError(30, "Read-only file system")
    )
    seen.clock.advance(DELETE_AFTER_TTLS * TTL_S + 1)
    seen.poll()
    seen.poll()
    assert unlink.call_count == 1
    assert first.exists() and second.exists()
    assert len(_logged(caplog, "Cannot delete expired discovery record")) == 1


def test_ensure_discovery_dir_writable_probes_a_write(tmp_path, mocker):
    assert ensure_discovery_dir(tmp_path, writable=True) == tmp_path
    assert list(tmp_path.iterdir()) == []  # the probe is gone
    # Root writes anywhere, so a read-only directory is simulated at the write itself.
    mocker.patch(
        "dynamo.runtime.discovery.file_store.tempfile.mkstemp",
        side_effect=PermissionError(13, "Permission denied"),
    )
    ensure_discovery_dir(tmp_path)  # listing alone still succeeds
    with pytest.raises(DiscoveryDirError, match=f"cannot write in {tmp_path}: Permission denied"):
        ensure_discovery_dir(tmp_path, writable=True)
