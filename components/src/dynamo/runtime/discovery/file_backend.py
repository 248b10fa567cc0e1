"""Model discovery through a shared directory: one JSON record per registered model instance.

Workers write ``<instance_id>.json`` atomically (temp file in the same directory, then
``os.replace``), so a reader sees either no record or a whole one. The frontend's
:class:`DiscoveryWatcher` polls the directory and reports records appearing and disappearing.
A half-written or malformed record is skipped with one WARNING (per file version), never a crash;
so is a file over ``MAX_RECORD_BYTES``, which is never read whole.

A record is a lease, the way an etcd key with a lease is in real Dynamo: a worker killed with
SIGKILL never removes its record, so while it lives it rewrites the record every heartbeat
interval (:class:`RecordHeartbeat`, an incremented ``heartbeat`` counter), and a watcher treats a
record whose content has not changed for longer than its TTL as gone. The watcher only asks "did
the content change since I last looked", timed on its own monotonic clock; it never compares a
timestamp written on another host (``heartbeat_at`` is for humans), so clock skew between pods
sharing the volume does not matter. A record without a ``heartbeat`` field (written before
leases existed) has no lease and stays until it is removed, as before.

Consequences worth knowing: a record left by a dead worker is reported for up to one TTL after a
frontend starts (the frontend has not yet seen it go unchanged). A watcher deletes a record file
that has stayed expired for ``DELETE_AFTER_TTLS`` TTLs (see :meth:`DiscoveryWatcher._collect`
for why that cannot take a live worker's record away for good).

The file system is shared and may be remote (NFS, CephFS, EFS): a directory that cannot be
listed, or a record that cannot be read, is "unknown", not "gone". The watcher then keeps the
records it last knew, warns once per distinct error, and restarts every lease's clock once it
can read again (a worker whose renewals fell into the blind spot gets a whole TTL to show one).

Every file-system call of the watcher and of the heartbeat runs in a worker thread
(:func:`run_off_loop`): a slow volume must not stall the event loop that serves requests. The
callbacks (``on_add`` / ``on_remove``) stay on the loop.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import stat as stat_module
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from dynamo.runtime.discovery.interface import (
    STATE_DEGRADED,
    STATE_OK,
    DiscoveryDirError,
    DiscoverySettings,
    RecordCallback,
)
from dynamo.runtime.discovery.mounts import network_filesystem_of
from dynamo.runtime.discovery.record import (
    DEFAULT_LEASE_TTL_S,
    MAX_RECORD_BYTES,
    ModelRecord,
)

logger = logging.getLogger(__name__)

RECORD_SUFFIX = ".json"
# Five heartbeats per TTL: a worker whose event loop stalls (a long GC pause, a busy engine step)
# can miss four in a row and stay listed.
HEARTBEATS_PER_TTL = 5
# The watcher never expires a record sooner than this many of the writer's own heartbeat
# intervals, whatever its TTL says: a frontend configured with a shorter TTL than its workers
# would otherwise drop and re-add live workers at every heartbeat.
MIN_HEARTBEATS_PER_TTL = 2
# A record expired for this many TTLs is deleted by the watcher that saw it expire. Long enough
# that only a worker that is truly gone (or stopped renewing for minutes) loses its file, and a
# worker that renews again writes it back whole anyway.
DELETE_AFTER_TTLS = 10.0
# How often an unchanged-looking record is read anyway, in TTLs. A network file system may
# answer stat() from its attribute cache for tens of seconds (NFS acregmax is 60 s by default),
# while opening a file revalidates it (close-to-open consistency): reading each record at least
# this often lets a renewal be seen well within one TTL whatever stat() says.
REREAD_EVERY_TTLS = 0.25

T = TypeVar("T")


def heartbeat_interval_for(ttl_s: float) -> float:
    """How often a worker rewrites its record so that a watcher with ``ttl_s`` keeps it."""
    return ttl_s / HEARTBEATS_PER_TTL


class DiscoveryStore:
    """The writer side, used by workers."""

    def __init__(self, directory: str | os.PathLike) -> None:
        self.directory = Path(directory)

    def path_for(self, instance_id: str) -> Path:
        return self.directory / f"{instance_id}{RECORD_SUFFIX}"

    def register(self, record: ModelRecord) -> Path:
        return self._write(record, durable=True)

    def renew(self, record: ModelRecord) -> ModelRecord:
        """Rewrite ``record`` with its heartbeat counter incremented; returns what was written.

        Atomic like :meth:`register`, but not fsynced: a heartbeat is liveness, not state worth
        keeping across a host crash (after one the worker is gone anyway), and an fsync on a
        network volume can block the worker's event loop for tens of milliseconds every time.
        """
        renewed = dataclasses.replace(
            record, heartbeat=(record.heartbeat or 0) + 1, heartbeat_at=time.time()
        )
        self._write(renewed, durable=False)
        return renewed

    def _write(self, record: ModelRecord, *, durable: bool) -> Path:
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.path_for(record.instance_id)
        fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=".tmp-", suffix=".part")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write(record.to_json())
                if durable:
                    handle.flush()
                    os.fsync(handle.fileno())
            os.replace(tmp, path)  # atomic: readers see no record or a whole one
        except BaseException:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
            raise
        return path

    def unregister(self, instance_id: str) -> None:
        try:
            self.path_for(instance_id).unlink()
        except FileNotFoundError:
            pass

    def read_all(self) -> dict[str, ModelRecord]:
        """Whole, valid records by instance id; invalid ones are skipped (see the watcher)."""
        records = {}
        for path in self._record_paths():
            try:
                record = ModelRecord.from_json(path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                continue
            records[record.instance_id] = record
        return records

    def _record_paths(self) -> list[Path]:
        try:
            return sorted(
                p
                for p in self.directory.iterdir()
                if p.suffix == RECORD_SUFFIX and not p.name.startswith(".")
            )
        except FileNotFoundError:
            return []


def ensure_discovery_dir(directory: str | os.PathLike, *, writable: bool = False) -> Path:
    """Create ``directory`` if it is missing; raise :class:`DiscoveryDirError` if unusable.

    For a process's start-up, before it serves: a watcher on a path that is a file, or that it
    may not list, would otherwise see "no workers" forever while reporting itself healthy; a
    worker (``writable=True``) that cannot write there would fail only at ``register_model``,
    after engine init. The write probe is a dot-file, which watchers ignore.
    """
    path = Path(directory)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except FileExistsError:  # exist_ok only covers an existing directory
        raise DiscoveryDirError(f"{path} exists and is not a directory") from None
    except NotADirectoryError:
        raise DiscoveryDirError(
            f"cannot create {path}: a parent of it is not a directory"
        ) from None
    except OSError as exc:
        raise DiscoveryDirError(f"cannot create {path}: {exc.strerror or exc}") from None
    if not path.is_dir():
        raise DiscoveryDirError(f"{path} is not a directory")
    try:
        with os.scandir(path) as entries:
            next(entries, None)
    except OSError as exc:
        raise DiscoveryDirError(f"cannot list {path}: {exc.strerror or exc}") from None
    if writable:
        try:
            fd, probe = tempfile.mkstemp(dir=path, prefix=".probe-", suffix=".part")
            os.close(fd)
            os.unlink(probe)
        except OSError as exc:
            raise DiscoveryDirError(f"cannot write in {path}: {exc.strerror or exc}") from None
    return path


async def run_off_loop(function: Callable[..., T], *args) -> T:
    """``function(*args)`` in a worker thread, so the event loop keeps serving meanwhile.

    A thread cannot be interrupted, so a cancellation waits for the call to return before it
    propagates: when ``stop()`` of a periodic task returns, nothing it started is still writing
    (the worker removes its record right after stopping its heartbeat; a rename landing after
    that would put the record back).
    """
    call = asyncio.ensure_future(asyncio.to_thread(function, *args))
    try:
        return await asyncio.shield(call)
    except asyncio.CancelledError:
        while not call.done():
            try:
                await asyncio.wait([call])
            except asyncio.CancelledError:  # a second cancel: still wait, still re-raise
                pass
        raise


class PeriodicTask:
    """Runs ``step`` every ``interval_s`` seconds on the running loop, until :meth:`stop`.

    The one shape of the worker's heartbeat and the frontend's watcher. A step that raises is
    logged with its traceback (once per distinct error while it repeats, then one INFO when a
    step succeeds again) and the next step runs on schedule: a periodic duty that dies silently
    leaves a process that looks healthy and does nothing.
    """

    def __init__(
        self,
        name: str,
        interval_s: float,
        step: Callable[[], Awaitable[None]],
        *,
        delay_first: bool = False,
    ) -> None:
        self.name = name
        self.interval_s = interval_s
        self.step = step
        self.delay_first = delay_first
        self.failures = 0  # steps that raised since the last one that did not
        self._last_error: str | None = None
        self._task: asyncio.Task | None = None

    async def run(self) -> None:
        if self.delay_first:
            await asyncio.sleep(self.interval_s)
        while True:
            try:
                await self.step()
            except Exception as exc:  # noqa: BLE001 - see the class docstring
                self._failed(exc)
            else:
                if self.failures:
                    logger.info(
                        "%s: running again after %d failed step(s)", self.name, self.failures
                    )
                self.failures = 0
                self._last_error = None
            await asyncio.sleep(self.interval_s)

    def _failed(self, exc: Exception) -> None:
        self.failures += 1
        error = f"{type(exc).__name__}: {exc}"
        if error != self._last_error:
            self._last_error = error
            logger.error(
                "%s: step failed (%s); retrying every %g s",
                self.name,
                error,
                self.interval_s,
                exc_info=exc,
            )

    def start(self) -> asyncio.Task:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self.run(), name=self.name)
        return self._task

    async def stop(self) -> None:
        """Cancel the task and wait until it has ended; idempotent."""
        task, self._task = self._task, None
        if task is None:
            return
        task.cancel()
        # wait() rather than `await task`: a CancelledError here is then ours, never the task's,
        # and stopping never raises what the task raised (shutdown must go on).
        await asyncio.wait([task])
        if not task.cancelled() and task.exception() is not None:
            logger.error("%s ended with an error", self.name, exc_info=task.exception())


class RecordHeartbeat:
    """The worker's side of the lease: renews its record every ``interval_s`` until stopped.

    Stop it before removing the record: a renewal after the removal would write it back
    (:meth:`stop` returns only once no renewal is in progress). A failed write is logged (once
    per run of failures) and retried at the next beat; the worker keeps serving, and a watcher
    drops it only if the failures outlast its TTL.
    """

    def __init__(self, store: DiscoveryStore, record: ModelRecord, interval_s: float) -> None:
        self.store = store
        self.record = record
        self.interval_s = interval_s
        self._failing = False
        self._periodic = PeriodicTask(
            "discovery-heartbeat", interval_s, self._beat_off_loop, delay_first=True
        )

    def beat(self) -> None:
        """One renewal, synchronous (the periodic task runs it in a worker thread)."""
        try:
            self.record = self.store.renew(self.record)
        except Exception as exc:  # noqa: BLE001 - the lease must outlive a bad write
            if not self._failing:
                logger.warning(
                    "Discovery heartbeat failed for %s: %s (retrying every %g s)",
                    self.store.path_for(self.record.instance_id),
                    exc,
                    self.interval_s,
                )
            self._failing = True
            return
        if self._failing:
            logger.info("Discovery heartbeat restored (heartbeat=%d)", self.record.heartbeat)
        self._failing = False

    async def _beat_off_loop(self) -> None:
        # A write to a network volume can block for tens of milliseconds: not on the loop.
        await run_off_loop(self.beat)

    async def run(self) -> None:
        await self._periodic.run()

    def start(self) -> asyncio.Task:
        return self._periodic.start()

    async def stop(self) -> None:
        await self._periodic.stop()


def _too_large(size: int) -> str:
    return f"{size} bytes or more, over the {MAX_RECORD_BYTES}-byte record limit (not read)"


def _stat_key(result: os.stat_result) -> tuple[int, int, int]:
    return (result.st_ino, result.st_mtime_ns, result.st_size)


@dataclass
class _FileVersion:
    """One read of one record file: what it held (a record, or why it is not one)."""

    key: tuple[int, int, int]  # (st_ino, st_mtime_ns, st_size) of the file that was read
    read_at: float  # the watcher's clock
    text: str = ""
    record: ModelRecord | None = None
    error: str | None = None  # why the content is not a record (malformed)


@dataclass
class _Sighting:
    """What a watcher last read in one record file, and when it changed (its own clock)."""

    text: str
    changed_at: float
    expired: bool = False


class DiscoveryWatcher:
    """Polls the discovery directory and reports added and removed records.

    ``on_add`` / ``on_remove`` may be plain functions or coroutines; an exception in one is
    logged and the watcher keeps going (one bad model must not blind the frontend to the rest).
    They run on the event loop; listing, stat and reads run in a worker thread.

    A record with a lease whose content has not changed for longer than ``ttl_s`` (measured on
    ``clock``, ``time.monotonic`` unless a test injects one) is reported removed, with one
    WARNING; it is reported added again if its content changes again. The TTL applied is never
    shorter than ``MIN_HEARTBEATS_PER_TTL`` of the interval the record says it is renewed at.
    A record expired for ``delete_after_ttls`` TTLs is deleted (None: never).
    """

    def __init__(
        self,
        directory: str | os.PathLike,
        *,
        on_add: RecordCallback,
        on_remove: RecordCallback,
        poll_interval_s: float = 0.2,
        ttl_s: float = DEFAULT_LEASE_TTL_S,
        clock: Callable[[], float] = time.monotonic,
        delete_after_ttls: float | None = DELETE_AFTER_TTLS,
    ) -> None:
        self.directory = Path(directory)
        self.on_add = on_add
        self.on_remove = on_remove
        self.poll_interval_s = poll_interval_s
        self.ttl_s = ttl_s
        self.delete_after_ttls = delete_after_ttls
        self._clock = clock
        self.known: dict[str, ModelRecord] = {}
        # Owned by the scanning thread (one scan at a time, see poll_once).
        self._files: dict[Path, _FileVersion] = {}
        self._sightings: dict[Path, _Sighting] = {}
        self._unreadable: dict[Path, str] = {}  # file -> the read error last warned about
        self._directory_error: str | None = None  # the listing error last warned about
        self._delete_failed = False
        self._periodic = PeriodicTask("discovery-watcher", poll_interval_s, self.poll_once)

    # --- the scanning thread ----------------------------------------------------------------

    def _list(self) -> list[Path] | None:
        """Record files in the directory; None when it cannot be listed (unknown, not empty)."""
        try:
            with os.scandir(self.directory) as entries:
                names = [
                    entry.name
                    for entry in entries
                    if entry.name.endswith(RECORD_SUFFIX) and not entry.name.startswith(".")
                ]
        except FileNotFoundError:
            names = []  # removed (or not created yet): no worker can have a record in it
        except OSError as exc:
            error = f"{type(exc).__name__}: {exc}"
            if error != self._directory_error:
                self._directory_error = error
                logger.warning(
                    "Cannot list the discovery directory %s (%s): keeping the %d record(s) "
                    "last seen until it can be read again",
                    self.directory,
                    error,
                    len(self._sightings),
                )
            return None
        if self._directory_error is not None:
            self._directory_error = None
            self._restart_leases()
        return [self.directory / name for name in sorted(names)]

    def _restart_leases(self) -> None:
        # Renewals written while this watcher could not look were never seen: judging the
        # leases by the old sightings would expire every live worker at once. Each gets one TTL
        # from now, as after a frontend start.
        now = self._clock()
        for sighting in self._sightings.values():
            if not sighting.expired:
                sighting.changed_at = now
        logger.info(
            "Discovery directory %s readable again: leases restart from now", self.directory
        )

    def _read(self, path: Path, now: float) -> _FileVersion | None:
        """The current version of one record file; None if it is gone.

        Not re-read while its (inode, mtime, size) is unchanged and its last read is recent:
        our writers replace the file atomically (a new inode per write, and every renewal
        changes the heartbeat counter), so an unchanged stat means unchanged content. The
        periodic re-read (``REREAD_EVERY_TTLS``) covers a stat() served from a stale cache.
        """
        previous = self._files.get(path)
        try:
            status = os.stat(path)
            key = _stat_key(status)
            if (
                previous is not None
                and previous.key == key
                and now - previous.read_at < REREAD_EVERY_TTLS * self.ttl_s
            ):
                return previous
            if not stat_module.S_ISREG(status.st_mode):  # a directory; a FIFO would block
                return self._malformed(path, previous, key, now, "", "not a regular file")
            if status.st_size > MAX_RECORD_BYTES:
                return self._malformed(path, previous, key, now, "", _too_large(status.st_size))
            with open(path, "rb") as handle:
                key = _stat_key(os.fstat(handle.fileno()))  # the key of what is read
                raw = handle.read(MAX_RECORD_BYTES + 1)  # it may have grown since the stat
            if len(raw) > MAX_RECORD_BYTES:
                return self._malformed(path, previous, key, now, "", _too_large(len(raw)))
        except FileNotFoundError:
            return None  # removed between listing and reading
        except OSError as exc:
            # Unknown, not malformed: keep what was last read (a transient EIO on a network
            # volume must not drop a live worker); the lease still expires it if this lasts.
            error = f"{type(exc).__name__}: {exc}"
            if self._unreadable.get(path) != error:
                self._unreadable[path] = error
                logger.warning(
                    "Cannot read discovery record %s (%s): keeping its last known state",
                    path,
                    error,
                )
            return previous
        self._unreadable.pop(path, None)
        try:
            text = raw.decode("utf-8")
            record = ModelRecord.from_json(text)
        except Exception as exc:  # noqa: BLE001 - any content (deep nesting too) is data
            return self._malformed(path, previous, key, now, raw.decode("latin-1"), str(exc))
        return _FileVersion(key=key, read_at=now, text=text, record=record)

    def _malformed(
        self,
        path: Path,
        previous: _FileVersion | None,
        key: tuple[int, int, int],
        now: float,
        text: str,
        error: str,
    ) -> _FileVersion:
        """A version that is not a record: one WARNING per file version, not per poll."""
        if previous is None or previous.error is None or previous.key != key:
            logger.warning("Ignoring malformed discovery record %s: %s", path, error)
        return _FileVersion(key=key, read_at=now, text=text, error=error)

    def _scan(self) -> dict[Path, _FileVersion] | None:
        """The valid records on disk by path; None when the directory cannot be listed."""
        paths = self._list()
        if paths is None:
            return None
        now = self._clock()
        versions: dict[Path, _FileVersion] = {}
        for path in paths:
            version = self._read(path, now)
            if version is not None:
                versions[path] = version
        self._files = versions  # files that went away are forgotten: they warn afresh
        # A file still listed but never readable (permissions, a symlink loop) keeps its entry,
        # so its WARNING is not repeated at every poll; one that went away warns afresh.
        listed = set(paths)
        for path in [p for p in self._unreadable if p not in listed]:
            del self._unreadable[path]
        return {p: v for p, v in versions.items() if v.record is not None}

    def _ttl_for(self, record: ModelRecord) -> float:
        if record.heartbeat_interval_s is None:
            return self.ttl_s
        return max(self.ttl_s, MIN_HEARTBEATS_PER_TTL * record.heartbeat_interval_s)

    def _live(self, found: dict[Path, _FileVersion]) -> dict[str, ModelRecord]:
        """The records whose lease holds (or that have none), by instance id."""
        now = self._clock()
        for path in [p for p in self._sightings if p not in found]:
            del self._sightings[path]
        live: dict[str, ModelRecord] = {}
        for path, version in found.items():
            record = version.record
            assert record is not None
            sighting = self._sightings.get(path)
            if sighting is None or sighting.text != version.text:
                if sighting is not None and sighting.expired:
                    logger.info("Discovery record %s renewed after it expired", path)
                sighting = self._sightings[path] = _Sighting(version.text, changed_at=now)
            if record.has_lease and self._expired(path, record, sighting, now):
                self._collect(path, version, record, sighting, now)
                continue
            live[record.instance_id] = record
        return live

    def _expired(self, path: Path, record: ModelRecord, sighting: _Sighting, now: float) -> bool:
        silent_s = now - sighting.changed_at
        if silent_s <= self._ttl_for(record):
            return False
        if not sighting.expired:  # warn once per expiry, not at every poll
            sighting.expired = True
            logger.warning(
                "Discovery record %s expired: no heartbeat for %.1f s (worker %s at %s)",
                path,
                silent_s,
                record.instance_id,
                record.endpoint,
            )
        return True

    def _collect(
        self,
        path: Path,
        version: _FileVersion,
        record: ModelRecord,
        sighting: _Sighting,
        now: float,
    ) -> None:
        """Delete a record file that has stayed expired for ``delete_after_ttls`` TTLs.

        Safe for a live worker: deleting only happens after the record went unchanged for many
        TTLs, and the file is checked unchanged (same inode, mtime, size) just before. Should a
        worker still be alive (stalled for minutes, or its renewals failing) and renew in the
        instant between that check and the unlink, its next heartbeat rewrites the whole record
        (a renewal is a full atomic write, not an update) and it is listed again one heartbeat
        later: it was not being routed to anyway. Records without a lease are never deleted.
        """
        if self.delete_after_ttls is None or self._delete_failed:
            return
        silent_s = now - sighting.changed_at
        if silent_s <= self.delete_after_ttls * self._ttl_for(record):
            return
        try:
            if _stat_key(os.stat(path)) != version.key:
                return  # changed since it was read: the next poll will see the new content
            os.unlink(path)
        except FileNotFoundError:
            return  # another frontend deleted it, or its worker finally did
        except OSError as exc:
            # A read-only mount, say: this watcher only needs to read. Say so once.
            self._delete_failed = True
            logger.warning(
                "Cannot delete expired discovery record %s (%s): expired records are left in "
                "place (and ignored) from now on",
                path,
                exc,
            )
            return
        logger.info(
            "Deleted discovery record %s: no heartbeat for %.0f s (worker %s at %s)",
            path,
            silent_s,
            record.instance_id,
            record.endpoint,
        )

    def _poll_files(self) -> dict[str, ModelRecord] | None:
        found = self._scan()
        return None if found is None else self._live(found)

    # --- the event loop ---------------------------------------------------------------------

    async def poll_once(self) -> None:
        current = await run_off_loop(self._poll_files)
        if current is None:
            return  # the directory cannot be listed: keep the last known records
        for instance_id in [i for i in self.known if i not in current]:
            record = self.known.pop(instance_id)
            await self._call(self.on_remove, record)
        for instance_id, record in current.items():
            if instance_id not in self.known:
                self.known[instance_id] = record
                await self._call(self.on_add, record)

    async def _call(self, callback: RecordCallback, record: ModelRecord) -> None:
        try:
            result = callback(record)
            if asyncio.iscoroutine(result):
                await result
        except Exception:  # see class docstring
            logger.exception("Discovery callback failed for %s (%s)", record.model, record.endpoint)

    async def run(self) -> None:
        await self._periodic.run()

    def start(self) -> asyncio.Task:
        return self._periodic.start()

    async def stop(self) -> None:
        await self._periodic.stop()


class FileRegistration:
    """The directory backend's lease: a record rewritten every heartbeat until unregistered."""

    def __init__(self, directory: str | os.PathLike, ttl_s: float) -> None:
        self.store = DiscoveryStore(directory)
        self.interval_s = heartbeat_interval_for(ttl_s)
        self.record: ModelRecord | None = None
        self._heartbeat: RecordHeartbeat | None = None

    async def connect(self) -> None:
        return None  # the directory was checked (and created) before start-up

    async def register(self, record: ModelRecord) -> ModelRecord:
        record = dataclasses.replace(record, heartbeat=0, heartbeat_interval_s=self.interval_s)
        self.store.register(record)
        self.record = record
        self._heartbeat = RecordHeartbeat(self.store, record, self.interval_s)
        self._heartbeat.start()
        return record

    async def unregister(self) -> None:
        # The heartbeat stops first: a renewal after the removal would write the record back.
        if self._heartbeat is not None:
            await self._heartbeat.stop()
        if self.record is not None:
            self.store.unregister(self.record.instance_id)

    def describe_lease(self) -> str:
        return f"heartbeat every {self.interval_s:g} s"

    async def close(self) -> None:
        return None


class FileWatcher(DiscoveryWatcher):
    """The directory watcher, with the state every backend reports."""

    @property
    def state(self) -> str:
        return STATE_DEGRADED if self._directory_error is not None else STATE_OK


@dataclasses.dataclass
class FileDiscovery:
    """The file store: a directory shared by the processes of one machine (or a volume)."""

    directory: str
    ttl_s: float = DEFAULT_LEASE_TTL_S
    backend: str = "file"

    @classmethod
    def from_settings(cls, settings: DiscoverySettings) -> FileDiscovery:
        return cls(settings.directory, settings.ttl_s)

    def describe(self) -> str:
        return f"directory {self.directory}"

    def check(self, *, writer: bool) -> None:
        ensure_discovery_dir(self.directory, writable=writer)

    def readable_beyond_host(self) -> str | None:
        mount = network_filesystem_of(self.directory)
        if mount is None:
            return None
        return (
            f"the discovery directory {self.directory} is on a {mount.fs_type} file system "
            f"(mounted at {mount.mount_point}), which other hosts read"
        )

    def registration(self) -> FileRegistration:
        return FileRegistration(self.directory, self.ttl_s)

    def watcher(self, *, on_add: RecordCallback, on_remove: RecordCallback) -> FileWatcher:
        return FileWatcher(self.directory, on_add=on_add, on_remove=on_remove, ttl_s=self.ttl_s)
