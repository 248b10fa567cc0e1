"""The file store as a :class:`~dynamo.runtime.discovery.Discovery`: a directory shared by the
processes of one machine (or a volume), a worker's lease kept by a heartbeat that rewrites its
record (:class:`RecordHeartbeat`), a frontend's :class:`~.file_watcher.FileWatcher`."""

from __future__ import annotations

import dataclasses
import logging
import os
import threading

from dynamo.runtime.discovery.file_lock import FileMaintenanceLock
from dynamo.runtime.discovery.file_store import (
    DiscoveryStore,
    check_private_directory,
    default_directory_base,
    ensure_discovery_dir,
    writable_by_others,
)
from dynamo.runtime.discovery.file_watcher import FileWatcher
from dynamo.runtime.discovery.interface import (
    DiscoverySettings,
    RecordCallback,
)
from dynamo.runtime.discovery.mounts import network_filesystem_of
from dynamo.runtime.discovery.periodic import PeriodicDuty, PeriodicTask, run_off_loop
from dynamo.runtime.discovery.record import (
    DEFAULT_LEASE_TTL_S,
    DEFAULT_MAX_RECORDS,
    ModelRecord,
)

logger = logging.getLogger(__name__)

# Five heartbeats per TTL: a worker whose event loop stalls (a long GC pause, a busy engine step)
# can miss four in a row and stay listed.
HEARTBEATS_PER_TTL = 5


def heartbeat_interval_for(ttl_s: float) -> float:
    """How often a worker rewrites its record so that a watcher with ``ttl_s`` keeps it."""
    return ttl_s / HEARTBEATS_PER_TTL


class RecordHeartbeat(PeriodicDuty):
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
        # A renewal and a state change (each in a thread of its own) write one at a time.
        self._writing = threading.Lock()
        self._periodic = PeriodicTask(
            "discovery-heartbeat", interval_s, self._beat_off_loop, delay_first=True
        )

    def set_state(self, state: str | None) -> None:
        """Write the record with this routing state now (synchronous; raises when the write
        fails, and the next renewal writes it)."""
        with self._writing:
            self.record = dataclasses.replace(self.record, state=state)
            self.record = self.store.renew(self.record)

    def beat(self) -> None:
        """One renewal, synchronous (the periodic task runs it in a worker thread)."""
        try:
            with self._writing:
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

    async def set_state(self, state: str | None) -> None:
        heartbeat = self._heartbeat
        assert heartbeat is not None, "register() runs first"
        try:
            await run_off_loop(heartbeat.set_state, state)
        finally:
            self.record = heartbeat.record

    def describe_lease(self) -> str:
        return f"heartbeat every {self.interval_s:g} s"

    async def close(self) -> None:
        return None


@dataclasses.dataclass
class FileDiscovery:
    """The file store: a directory shared by the processes of one machine (or a volume)."""

    directory: str
    ttl_s: float = DEFAULT_LEASE_TTL_S
    max_records: int = DEFAULT_MAX_RECORDS
    # The trusted place the default directory was made under (None: an operator chose it).
    private_base: str | None = None
    backend: str = "file"

    @classmethod
    def from_settings(cls, settings: DiscoverySettings) -> FileDiscovery:
        base = default_directory_base() if settings.directory_is_default else None
        return cls(settings.directory, settings.ttl_s, settings.max_records, base)

    def describe(self) -> str:
        return f"directory {self.directory}"

    def check(self, *, writer: bool) -> None:
        if self.private_base is not None:
            check_private_directory(self.directory, self.private_base)
        ensure_discovery_dir(self.directory, writable=writer)
        if self.private_base is None and writable_by_others(self.directory):
            logger.warning(
                "The discovery directory %s is writable by every user of this host: any of "
                "them can publish records this process trusts as workers'. Use a directory "
                "only the deployment's processes can write (mode 0750 or 0770)",
                self.directory,
            )

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

    def maintenance_lock(self, model: str, instance_id: str) -> FileMaintenanceLock:
        return FileMaintenanceLock(self.directory, model, instance_id, ttl_s=self.ttl_s)

    def watcher(
        self, *, on_add: RecordCallback, on_remove: RecordCallback, quiet: bool = False
    ) -> FileWatcher:
        return FileWatcher(
            self.directory,
            on_add=on_add,
            on_remove=on_remove,
            ttl_s=self.ttl_s,
            max_records=self.max_records,
            quiet=quiet,
        )
