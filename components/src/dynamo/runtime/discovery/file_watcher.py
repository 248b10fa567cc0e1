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

import heapq
import logging
import os
import stat as stat_module
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from dynamo.runtime.discovery.file_store import RECORD_SUFFIX
from dynamo.runtime.discovery.interface import (
    STATE_DEGRADED,
    STATE_OK,
    RecordCallback,
)
from dynamo.runtime.discovery.periodic import PeriodicDuty, PeriodicTask, notify, run_off_loop
from dynamo.runtime.discovery.record import (
    DEFAULT_LEASE_TTL_S,
    DEFAULT_MAX_RECORDS,
    MAX_RECORD_BYTES,
    ModelRecord,
)
from dynamo.runtime.discovery.record_files import (
    StatKey,
    content_digest,
    read_record_file,
    stat_key,
    too_large,
)
from dynamo.runtime.log_budget import LogBudget
from dynamo.runtime.peer_text import escape

logger = logging.getLogger(__name__)

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
# Malformed record files get one WARNING each (per file version), but no more than this many a
# minute: a directory flooded with junk is a bounded log.
MALFORMED_LINES_PER_MINUTE = 50
# A poll stuck in the file system for longer than a TTL (and at least this) degrades the watcher.
STUCK_POLL_FLOOR_S = 5.0


@dataclass
class _FileVersion:
    """One read of one record file: what it held (a record, or why it is not one)."""

    key: StatKey  # (st_ino, st_mtime_ns, st_size) of the file that was read
    read_at: float  # the watcher's clock
    digest: bytes = b""
    record: ModelRecord | None = None
    error: str | None = None  # why the content is not a record (malformed)


@dataclass
class _Sighting:
    """What a watcher last read in one record file, and when it changed (its own clock)."""

    digest: bytes
    changed_at: float
    expired: bool = False


class DiscoveryWatcher(PeriodicDuty):
    """Polls the discovery directory and reports added and removed records.

    ``on_add`` / ``on_remove`` may be plain functions or coroutines; an exception in one is
    logged and the watcher keeps going (one bad model must not blind the frontend to the rest).
    They run on the event loop; listing, stat and reads run in a worker thread.

    A record with a lease whose content has not changed for longer than ``ttl_s`` (measured on
    ``clock``, ``time.monotonic`` unless a test injects one) is reported removed, with one
    WARNING; it is reported added again if its content changes again. The TTL applied is never
    shorter than ``MIN_HEARTBEATS_PER_TTL`` of the interval the record says it is renewed at.
    A record expired for ``delete_after_ttls`` TTLs is deleted (None: never).

    ``quiet``: a reader for a process that only needs to know the records (a worker watching
    its peers): it deletes nothing, and every line it would log (malformed, unreadable and
    expired records, the directory's errors) is DEBUG. Those are the frontends' to report and
    act on; the same lines from every worker would repeat each one per worker.
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
        max_records: int = DEFAULT_MAX_RECORDS,
        quiet: bool = False,
    ) -> None:
        self.directory = Path(directory)
        self.on_add = on_add
        self.on_remove = on_remove
        self.poll_interval_s = poll_interval_s
        self.ttl_s = ttl_s
        self.delete_after_ttls = None if quiet else delete_after_ttls
        self._warn_level = logging.DEBUG if quiet else logging.WARNING
        self._info_level = logging.DEBUG if quiet else logging.INFO
        self._clock = clock
        self.known: dict[str, ModelRecord] = {}
        # Owned by the scanning thread (one scan at a time, see poll_once).
        self._files: dict[Path, _FileVersion] = {}
        self._sightings: dict[Path, _Sighting] = {}
        self._unreadable: dict[Path, str] = {}  # file -> the read error last warned about
        self._directory_error: str | None = None  # the listing error last warned about
        self._delete_failed = False
        self.max_records = max_records
        self._over_limit = 0  # record files listed past max_records at the last poll
        # Peers trigger these lines (a record file is anyone's who can write the directory):
        # each cause gets a budget of lines a minute, whatever the number of files.
        warn, info = self._warn_level, self._info_level
        self._malformed_lines = LogBudget(
            logger, warn, lines=MALFORMED_LINES_PER_MINUTE, clock=clock
        )
        self._unreadable_lines = LogBudget(logger, warn, clock=clock)
        self._expired_lines = LogBudget(logger, warn, clock=clock)
        self._renewed_lines = LogBudget(logger, info, clock=clock)
        self._deleted_lines = LogBudget(logger, info, clock=clock)
        self._over_limit_lines = LogBudget(logger, warn, lines=1, clock=clock)
        self._periodic = PeriodicTask("discovery-watcher", poll_interval_s, self.poll_once)

    # --- the scanning thread ----------------------------------------------------------------

    def _list(self) -> list[Path] | None:
        """Record files in the directory; None when it cannot be listed (unknown, not empty)."""
        try:
            with os.scandir(self.directory) as entries:
                listed = [
                    entry.name
                    for entry in entries
                    if entry.name.endswith(RECORD_SUFFIX) and not entry.name.startswith(".")
                ]
        except FileNotFoundError:
            listed = []  # removed (or not created yet): no worker can have a record in it
        except OSError as exc:
            error = f"{type(exc).__name__}: {exc}"
            if error != self._directory_error:
                self._directory_error = error
                logger.log(
                    self._warn_level,
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
        # The first max_records names, in order: the same ones at every poll and in every
        # frontend, so the limit never makes instances come and go.
        names = heapq.nsmallest(self.max_records, listed)
        self._over_limit = len(listed) - len(names)
        if self._over_limit:
            self._over_limit_lines.emit(
                "Discovery directory %s holds %d record files, over the limit of %d "
                "(--discovery-max-records / DYN_DISCOVERY_MAX_RECORDS): the %d last by name "
                "are ignored",
                self.directory,
                len(listed),
                self.max_records,
                self._over_limit,
            )
        return [self.directory / name for name in names]

    def _restart_leases(self) -> None:
        # Renewals written while this watcher could not look were never seen: judging the
        # leases by the old sightings would expire every live worker at once. Each gets one TTL
        # from now, as after a frontend start.
        now = self._clock()
        for sighting in self._sightings.values():
            if not sighting.expired:
                sighting.changed_at = now
        logger.log(
            self._info_level,
            "Discovery directory %s readable again: leases restart from now",
            self.directory,
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
            status = os.lstat(path)
            key = stat_key(status)
            if (
                previous is not None
                and previous.key == key
                and now - previous.read_at < REREAD_EVERY_TTLS * self.ttl_s
            ):
                return previous
            if stat_module.S_ISLNK(status.st_mode):
                return self._malformed(path, previous, key, now, "a symbolic link (not followed)")
            if not stat_module.S_ISREG(status.st_mode):  # a directory, a FIFO, a device
                return self._malformed(path, previous, key, now, "not a regular file")
            if status.st_size > MAX_RECORD_BYTES:
                return self._malformed(path, previous, key, now, too_large(status.st_size))
            read = read_record_file(path)
            if isinstance(read, str):  # what the file turned into between the stat and the open
                return self._malformed(path, previous, key, now, read)
            key, raw = read
        except FileNotFoundError:
            return None  # removed between listing and reading
        except OSError as exc:
            # Unknown, not malformed: keep what was last read (a transient EIO on a network
            # volume must not drop a live worker); the lease still expires it if this lasts.
            error = f"{type(exc).__name__}: {exc}"
            if self._unreadable.get(path) != error:
                self._unreadable[path] = error
                self._unreadable_lines.emit(
                    "Cannot read discovery record %s (%s): keeping its last known state",
                    escape(path, 300),
                    escape(error),
                )
            return previous
        self._unreadable.pop(path, None)
        try:
            record = ModelRecord.from_json(raw.decode("utf-8"))
        except Exception as exc:  # noqa: BLE001 - any content (deep nesting too) is data
            return self._malformed(path, previous, key, now, str(exc), digest=content_digest(raw))
        expected_name = record.instance_id + RECORD_SUFFIX
        if path.name != expected_name:
            # A worker writes its record under its own instance id; a record under another name
            # (a copy, a forgery) would make two records for one instance.
            return self._malformed(
                path,
                previous,
                key,
                now,
                f"holds instance {record.instance_id}, whose record is {expected_name}",
                digest=content_digest(raw),
            )
        return _FileVersion(key=key, read_at=now, digest=content_digest(raw), record=record)

    def _malformed(
        self,
        path: Path,
        previous: _FileVersion | None,
        key: StatKey,
        now: float,
        error: str,
        *,
        digest: bytes = b"",
    ) -> _FileVersion:
        """A version that is not a record: one WARNING per file version, not per poll, within
        the malformed-record budget (a directory full of them is a few lines a minute)."""
        if previous is None or previous.error is None or previous.key != key:
            self._malformed_lines.emit(
                "Ignoring malformed discovery record %s: %s", escape(path, 300), escape(error)
            )
        return _FileVersion(key=key, read_at=now, digest=digest, error=error)

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
            if sighting is None or sighting.digest != version.digest:
                if sighting is not None and sighting.expired:
                    self._renewed_lines.emit(
                        "Discovery record %s renewed after it expired", escape(path, 300)
                    )
                sighting = self._sightings[path] = _Sighting(version.digest, changed_at=now)
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
            self._expired_lines.emit(
                "Discovery record %s expired: no heartbeat for %.1f s (worker %s at %s)",
                escape(path, 300),
                silent_s,
                record.instance_id,
                escape(record.endpoint),
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
            if stat_key(os.stat(path)) != version.key:
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
        self._deleted_lines.emit(
            "Deleted discovery record %s: no heartbeat for %.0f s (worker %s at %s)",
            escape(path, 300),
            silent_s,
            record.instance_id,
            escape(record.endpoint),
        )

    def _poll_files(self) -> dict[str, ModelRecord] | None:
        found = self._scan()
        return None if found is None else self._live(found)

    # --- the event loop ---------------------------------------------------------------------

    async def poll_once(self) -> None:
        current = await run_off_loop(self._poll_files)
        if current is None:
            return  # the directory cannot be listed: keep the last known records
        for instance_id, known in list(self.known.items()):
            record = current.get(instance_id)
            if record is None or not record.serves_like(known):
                # Gone, or rewritten in place under the same instance id to serve otherwise
                # (another endpoint, model or card): the old one goes, the new one comes below.
                del self.known[instance_id]
                await notify(self.on_remove, known)
        for instance_id, record in current.items():
            seen = self.known.get(instance_id)
            if seen is None or seen.state != record.state:  # new, or its routing state moved
                self.known[instance_id] = record
                await notify(self.on_add, record)


class FileWatcher(DiscoveryWatcher):
    """The directory watcher, with the state every backend reports: ``degraded`` while the
    directory cannot be listed, or while a poll has been stuck in the file system for longer
    than a TTL (no record can be seen, new or gone, until it returns)."""

    @property
    def state(self) -> str:
        stuck = self._periodic.stuck_for_s > max(STUCK_POLL_FLOOR_S, self.ttl_s)
        return STATE_DEGRADED if self._directory_error is not None or stuck else STATE_OK
