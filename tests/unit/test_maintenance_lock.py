"""The file store's GC maintenance lock (one instance of a model at a time, stale after the TTL on
the reader's clock), and the file registration's routing state. etcd's lock and state are
tests/integration/test_etcd_maintenance.py's (a real etcd)."""

from __future__ import annotations

import asyncio
import json
import logging
import os

import pytest

from dynamo.runtime.discovery import ModelRecord
from dynamo.runtime.discovery.file_backend import FileDiscovery, FileRegistration
from dynamo.runtime.discovery.file_lock import FileMaintenanceLock, lock_path
from dynamo.runtime.discovery.file_store import DiscoveryStore
from tests.support.clock import FakeClock

TTL_S = 10.0


def lock(directory, instance_id: str, clock=None, model: str = "m") -> FileMaintenanceLock:
    return FileMaintenanceLock(
        directory, model, instance_id, ttl_s=TTL_S, clock=clock or FakeClock()
    )


def acquire(each: FileMaintenanceLock) -> bool:
    """Take it in a loop of its own; the loop ends after, so its renewals stop: a holder that
    died (its file left behind) unless the test releases it."""

    async def take() -> bool:
        taken = await each.acquire()
        if each._renewal is not None:
            await each._renewal.stop()  # renewals are driven by hand here (_renew)
        return taken

    return asyncio.run(take())


def release(each: FileMaintenanceLock) -> None:
    asyncio.run(each.release())


def held(each: FileMaintenanceLock) -> bool:
    return asyncio.run(each.held())


def held_and_waiting(directory, holder_id: str, waiter_id: str):
    """(holder, waiter, waiter's clock): model m's lock taken by ``holder_id`` (its renewals
    stopped: see :func:`acquire`), and ``waiter_id``'s on a fake clock of its own, not yet tried."""
    holder = lock(directory, holder_id)
    assert acquire(holder)
    clock = FakeClock()
    return holder, lock(directory, waiter_id, clock), clock


def test_one_instance_of_a_model_holds_it_at_a_time(tmp_path):
    first, second, other_model = (
        lock(tmp_path, "a"),
        lock(tmp_path, "b"),
        lock(tmp_path, "c", model="n"),
    )
    assert acquire(first) and held(first)
    assert not acquire(second) and not held(second)
    assert acquire(other_model)  # each model has its own
    content = json.loads(lock_path(tmp_path, "m").read_text())
    assert content == {"instance_id": "a", "taken": first._token, "beat": 0}
    release(first)
    assert not lock_path(tmp_path, "m").exists()
    assert acquire(second) and held(second)
    release(second)
    release(other_model)


def test_the_lock_file_is_a_dot_file_no_watcher_reads_as_a_record(tmp_path):
    path = lock_path(tmp_path, "any model name / with ../ and \n")
    assert path.parent == tmp_path and path.name.startswith(".") and path.suffix == ".lock"


def test_a_dead_holders_lock_is_broken_after_the_ttl_on_the_readers_clock(tmp_path, caplog):
    dead, waiting, clock = held_and_waiting(tmp_path, "dead", "next")  # dead: never renewed
    assert not acquire(waiting)  # first sighting: the clock starts now
    clock.advance(TTL_S)
    assert not acquire(waiting)  # unchanged for exactly the TTL: not yet
    clock.advance(0.1)
    assert acquire(waiting) and held(waiting) and not held(dead)
    assert json.loads(lock_path(tmp_path, "m").read_text())["instance_id"] == "next"
    assert [r.levelno for r in caplog.records if "was stale" in r.getMessage()] == [logging.WARNING]
    release(dead)  # a holder back from the dead removes nothing of the new one's
    assert held(waiting)
    release(waiting)


def test_a_renewed_lock_is_never_broken(tmp_path):
    holder, waiting, clock = held_and_waiting(tmp_path, "alive", "next")
    for _ in range(10):
        assert not acquire(waiting)
        clock.advance(TTL_S * 0.9)
        holder._renew()  # the holder's renewal: its content changes
    assert held(holder)
    release(holder)


def test_a_lock_taken_again_and_again_within_the_ttl_is_never_broken(tmp_path):
    """A worker maintained at every cycle lets go and takes the lock again within the TTL, never
    renewing: each taking is a new file, which ext4 gives the inode just freed, with the same
    beat; its token makes it read as changed (the soak saw a live lock broken without it)."""
    holder = lock(tmp_path, "busy")
    clock = FakeClock()
    waiting = lock(tmp_path, "next", clock)
    for _ in range(10):
        assert acquire(holder)
        assert not acquire(waiting)
        clock.advance(TTL_S * 0.9)
        release(holder)
    assert acquire(holder)
    assert not acquire(waiting) and held(holder)
    release(holder)


def test_a_holder_whose_file_was_broken_and_replaced_in_its_inode_sees_it_lost(tmp_path):
    """Whoever took the lock after a break may have a file with the broken one's inode number:
    the old holder still sees it lost (the token), and its release leaves the new lock alone."""
    stalled = lock(tmp_path, "stalled")
    assert acquire(stalled)
    path = lock_path(tmp_path, "m")
    newer = lock(tmp_path, "newer")
    # The break and the new taking, in the same file (the same inode), as a reused inode looks.
    newer._token = "0" * 32
    path.write_text(json.dumps({"instance_id": "newer", "taken": newer._token, "beat": 0}))
    assert not held(stalled)
    release(stalled)
    assert path.exists() and json.loads(path.read_text())["instance_id"] == "newer"


def test_a_lock_taken_anew_between_the_judgement_and_the_break_is_put_back(tmp_path):
    dead, breaker, clock = held_and_waiting(tmp_path, "dead", "breaker")
    assert not acquire(breaker)
    clock.advance(TTL_S + 1)
    assert breaker._stale()  # judged stale ...
    # ... and in that instant another instance broke it and took it (a new file, a new inode).
    os.unlink(lock_path(tmp_path, "m"))
    newer = lock(tmp_path, "newer")
    assert acquire(newer)
    assert not breaker._break()  # what it moved aside was not what it judged: put back
    assert held(newer) and not held(breaker)
    assert [p.name for p in tmp_path.iterdir()] == [lock_path(tmp_path, "m").name]
    release(newer)


def test_what_is_at_the_lock_path_and_no_lock_file_is_never_broken(tmp_path):
    target = tmp_path / "elsewhere"
    target.write_text("{}")
    os.symlink(target, lock_path(tmp_path, "m"))  # a peer's trick
    clock = FakeClock()
    waiting = lock(tmp_path, "next", clock)
    for _ in range(3):
        assert not acquire(waiting)
        clock.advance(TTL_S * 2)
    assert target.read_text() == "{}" and lock_path(tmp_path, "m").is_symlink()


def test_the_file_registration_publishes_its_routing_state(tmp_path):
    async def scenario():
        registration = FileRegistration(tmp_path, ttl_s=1.0)
        await registration.register(ModelRecord("m", "http://127.0.0.1:9", "i1"))
        store = DiscoveryStore(tmp_path)
        await registration.set_state("withdrawn")
        assert store.read_all()["i1"].state == "withdrawn"
        heartbeat = registration._heartbeat
        assert heartbeat is not None
        await asyncio.to_thread(heartbeat.beat)  # a renewal keeps the state
        assert store.read_all()["i1"].state == "withdrawn"
        await registration.set_state(None)
        assert store.read_all()["i1"].state is None
        await registration.unregister()

    asyncio.run(scenario())


def test_a_state_that_cannot_be_written_now_is_written_at_the_next_renewal(tmp_path, mocker):
    async def scenario():
        registration = FileRegistration(tmp_path, ttl_s=1.0)
        await registration.register(ModelRecord("m", "http://127.0.0.1:9", "i1"))
        heartbeat = registration._heartbeat
        assert heartbeat is not None
        renew = mocker.patch.object(heartbeat.store, "renew", side_effect=OSError("EIO"))
        with pytest.raises(OSError):
            await registration.set_state("withdrawn")
        renew.side_effect = None
        renew.side_effect = DiscoveryStore.renew.__get__(heartbeat.store)
        await asyncio.to_thread(heartbeat.beat)
        assert DiscoveryStore(tmp_path).read_all()["i1"].state == "withdrawn"
        await registration.unregister()

    asyncio.run(scenario())


def test_the_file_discovery_hands_out_its_lock():
    discovery = FileDiscovery("/tmp/x", ttl_s=3.0)
    each = discovery.maintenance_lock("m", "i1")
    assert isinstance(each, FileMaintenanceLock) and each.ttl_s == 3.0
