"""One discovery interface, two backends: what the launchers talk to.

The worker gets a :class:`Registration` (``connect`` at start-up, ``register`` at
``register_model``, ``unregister`` at the start of the drain); the frontend gets a
:class:`RecordWatcher` (``on_add`` / ``on_remove`` callbacks, a ``state`` for ``/health`` and
the ``dynamo_discovery_degraded`` metric). Neither knows which store is behind them:

* ``file`` (the default): the shared directory of :mod:`dynamo.runtime.discovery`, for the
  processes of one machine (a record rewritten every heartbeat, expired by the watchers);
* ``etcd``: one key per record with an etcd lease (:mod:`dynamo.runtime.discovery_etcd`), for
  deployments beyond one machine. Its client is imported by :func:`open_discovery`, which both
  launchers call before their start-up freeze, so the freeze covers the client's modules.

A record is opaque JSON to both backends (:meth:`ModelRecord.to_json` / ``from_json``), at most
:data:`~dynamo.runtime.discovery.MAX_RECORD_BYTES` long.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
from typing import Protocol

from dynamo.runtime.discovery import (
    DiscoveryStore,
    DiscoveryWatcher,
    ModelRecord,
    RecordCallback,
    RecordHeartbeat,
    heartbeat_interval_for,
)

logger = logging.getLogger(__name__)

# What a watcher reports: not connected yet (not ready), up to date, or cut off from the store
# (it keeps routing to what it knew).
STATE_CONNECTING = "connecting"
STATE_OK = "ok"
STATE_DEGRADED = "degraded"


class Registration(Protocol):
    """The worker's side: its one record, kept alive while it serves."""

    async def connect(self) -> None:
        """Start-up: return once the store answers (retrying, with back-off, until then)."""

    async def register(self, record: ModelRecord) -> ModelRecord:
        """Publish ``record`` and keep it alive; returns what was published."""

    async def unregister(self) -> None:
        """Stop keeping the record alive and remove it (the frontend stops routing at once)."""

    async def close(self) -> None:
        """Release the connection; idempotent."""

    def describe_lease(self) -> str:
        """How the record is kept alive, for the "Model registered" line."""


class RecordWatcher(Protocol):
    """The frontend's side: reports records appearing and disappearing."""

    known: dict[str, ModelRecord]

    @property
    def state(self) -> str:
        """``connecting``, ``ok`` or ``degraded`` (see the STATE_* constants)."""

    def start(self): ...

    async def stop(self) -> None: ...


class Discovery(Protocol):
    backend: str

    def describe(self) -> str:
        """Where records live, for log lines (never a credential)."""

    @property
    def readable_beyond_host(self) -> bool:
        """Whether processes on other hosts can read the records (a request plane bound to
        loopback is then unreachable to the frontends that find it)."""

    def registration(self, ttl_s: float) -> Registration: ...

    def watcher(
        self, *, on_add: RecordCallback, on_remove: RecordCallback, ttl_s: float
    ) -> RecordWatcher: ...


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
    directory: str
    backend: str = "file"

    def describe(self) -> str:
        return f"directory {self.directory}"

    @property
    def readable_beyond_host(self) -> bool:
        # A directory is taken to be this host's: whether it is a network mount is not
        # something to guess at start-up.
        return False

    def registration(self, ttl_s: float) -> FileRegistration:
        return FileRegistration(self.directory, ttl_s)

    def watcher(
        self, *, on_add: RecordCallback, on_remove: RecordCallback, ttl_s: float
    ) -> FileWatcher:
        return FileWatcher(self.directory, on_add=on_add, on_remove=on_remove, ttl_s=ttl_s)


def open_discovery(config: argparse.Namespace) -> Discovery:
    """The backend ``config`` selects. Imports the etcd client (before the freeze) for etcd.

    Raises :class:`~dynamo.runtime.discovery_etcd.EtcdSettingsError` for unusable etcd
    settings in the environment (the launchers exit 2 on it).
    """
    if config.discovery_backend == "etcd":
        from dynamo.runtime.discovery_etcd import EtcdDiscovery

        return EtcdDiscovery.from_config(config)
    return FileDiscovery(config.discovery_dir)
