"""Model discovery through a shared directory: one JSON record per registered model instance.

Workers write ``<instance_id>.json`` atomically (temp file in the same directory, then
``os.replace``), so a reader sees either no record or a whole one. The frontend's
:class:`DiscoveryWatcher` polls the directory and reports records appearing and disappearing.
A half-written or malformed record is skipped with one WARNING (per file version), never a crash.

A record is a lease, the way an etcd key with a lease is in real Dynamo: a worker killed with
SIGKILL never removes its record, so while it lives it rewrites the record every heartbeat
interval (:class:`RecordHeartbeat`, an incremented ``heartbeat`` counter), and a watcher treats a
record whose content has not changed for longer than its TTL as gone. The watcher only asks "did
the content change since I last looked", timed on its own monotonic clock; it never compares a
timestamp written on another host (``heartbeat_at`` is for humans), so clock skew between pods
sharing the volume does not matter. A record without a ``heartbeat`` field (written before
leases existed) has no lease and stays until it is removed, as before.

Consequences worth knowing: a record left by a dead worker is reported for up to one TTL after a
frontend starts (the frontend has not yet seen it go unchanged), and the file itself stays in the
directory until someone removes it; it is ignored, with one WARNING when it expires.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import math
import os
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Awaitable, Callable

logger = logging.getLogger(__name__)

RECORD_SUFFIX = ".json"
# A record unchanged for this long is treated as gone. Five heartbeats per TTL: a worker whose
# event loop stalls (a long GC pause, a busy engine step) can miss four in a row and stay listed.
DEFAULT_LEASE_TTL_S = 10.0
HEARTBEATS_PER_TTL = 5
# The watcher never expires a record sooner than this many of the writer's own heartbeat
# intervals, whatever its TTL says: a frontend configured with a shorter TTL than its workers
# would otherwise drop and re-add live workers at every heartbeat.
MIN_HEARTBEATS_PER_TTL = 2


def heartbeat_interval_for(ttl_s: float) -> float:
    """How often a worker rewrites its record so that a watcher with ``ttl_s`` keeps it."""
    return ttl_s / HEARTBEATS_PER_TTL


@dataclass(frozen=True)
class ModelRecord:
    """One registered model instance: which model, and where its request plane listens."""

    model: str
    endpoint: str  # base URL of the worker's request plane, e.g. http://127.0.0.1:40123
    instance_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    pid: int = field(default_factory=os.getpid)
    registered_at: float = field(default_factory=time.time)
    # The lease (None: a record without one, as written before leases existed). `heartbeat`
    # counts rewrites, so every rewrite changes the content; `heartbeat_at` is the writer's
    # wall clock, informative only (watchers never compare it with theirs).
    heartbeat: int | None = None
    heartbeat_at: float | None = None
    heartbeat_interval_s: float | None = None

    @property
    def has_lease(self) -> bool:
        return self.heartbeat is not None

    def to_json(self) -> str:
        # Absent lease fields are left out: the record keeps the shape older readers know.
        data = {k: v for k, v in asdict(self).items() if v is not None}
        return json.dumps(data, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "ModelRecord":
        data = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError("record is not a JSON object")
        try:
            record = cls(
                model=data["model"],
                endpoint=data["endpoint"],
                instance_id=data["instance_id"],
                pid=int(data.get("pid", 0)),
                registered_at=float(data.get("registered_at", 0.0)),
                heartbeat=_optional(int, data.get("heartbeat")),
                heartbeat_at=_optional(float, data.get("heartbeat_at")),
                heartbeat_interval_s=_optional(float, data.get("heartbeat_interval_s")),
            )
        except KeyError as exc:
            raise ValueError(f"record lacks field {exc.args[0]!r}") from None
        except (TypeError, OverflowError) as exc:  # "pid": null, "registered_at": {}, Infinity
            raise ValueError(f"record has a field of the wrong type: {exc}") from None
        for name in ("model", "endpoint", "instance_id"):
            value = getattr(record, name)
            if not isinstance(value, str) or not value:
                raise ValueError(f"record field {name!r} must be a non-empty string")
        interval = record.heartbeat_interval_s
        if interval is not None and not (math.isfinite(interval) and interval > 0):
            raise ValueError("record field 'heartbeat_interval_s' must be a positive number")
        return record


def _optional(convert: Callable, value: object):
    return None if value is None else convert(value)


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


RecordCallback = Callable[[ModelRecord], Awaitable[None] | None]


class RecordHeartbeat:
    """The worker's side of the lease: renews its record every ``interval_s`` until stopped.

    Stop it before removing the record: a renewal after the removal would write it back. A
    failed write is logged (once per run of failures) and retried at the next beat; the worker
    keeps serving, and a watcher drops it only if the failures outlast its TTL.
    """

    def __init__(self, store: DiscoveryStore, record: ModelRecord, interval_s: float) -> None:
        self.store = store
        self.record = record
        self.interval_s = interval_s
        self._failing = False
        self._task: asyncio.Task | None = None

    def beat(self) -> None:
        """One renewal (synchronous: a cancellation can never land between write and rename)."""
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

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            self.beat()

    def start(self) -> asyncio.Task:
        self._task = asyncio.get_running_loop().create_task(self.run(), name="discovery-heartbeat")
        return self._task

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None


@dataclass
class _Sighting:
    """What a watcher last read in one record file, and when (its own monotonic clock)."""

    text: str
    changed_at: float
    expired: bool = False


class DiscoveryWatcher:
    """Polls the discovery directory and reports added and removed records.

    ``on_add`` / ``on_remove`` may be plain functions or coroutines; an exception in one is
    logged and the watcher keeps going (one bad model must not blind the frontend to the rest).

    A record with a lease whose content has not changed for longer than ``ttl_s`` (measured on
    ``clock``, ``time.monotonic`` unless a test injects one) is reported removed, with one
    WARNING; it is reported added again if its content changes again. The TTL applied is never
    shorter than ``MIN_HEARTBEATS_PER_TTL`` of the interval the record says it is renewed at.
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
    ) -> None:
        self.directory = Path(directory)
        self.on_add = on_add
        self.on_remove = on_remove
        self.poll_interval_s = poll_interval_s
        self.ttl_s = ttl_s
        self._clock = clock
        self.known: dict[str, ModelRecord] = {}
        # path -> (mtime_ns, size) of files already reported as malformed, to warn once each
        self._bad: dict[Path, tuple[int, int]] = {}
        self._sightings: dict[Path, _Sighting] = {}
        self._task: asyncio.Task | None = None

    def _scan(self) -> dict[Path, tuple[ModelRecord, str]]:
        found: dict[Path, tuple[ModelRecord, str]] = {}
        try:
            paths = [
                p
                for p in self.directory.iterdir()
                if p.suffix == RECORD_SUFFIX and not p.name.startswith(".")
            ]
        except FileNotFoundError:
            return found
        seen_bad = set()
        for path in paths:
            stat = None
            try:
                stat = path.stat()
                text = path.read_text(encoding="utf-8")
                record = ModelRecord.from_json(text)
            except FileNotFoundError:
                continue  # removed between listing and reading
            except (OSError, ValueError, UnicodeDecodeError) as exc:
                seen_bad.add(path)
                version = (stat.st_mtime_ns, stat.st_size) if stat else (0, 0)
                if self._bad.get(path) != version:
                    self._bad[path] = version
                    logger.warning("Ignoring malformed discovery record %s: %s", path, exc)
                continue
            found[path] = (record, text)
        for path in list(self._bad):
            if path not in seen_bad:
                del self._bad[path]
        return found

    def _ttl_for(self, record: ModelRecord) -> float:
        if record.heartbeat_interval_s is None:
            return self.ttl_s
        return max(self.ttl_s, MIN_HEARTBEATS_PER_TTL * record.heartbeat_interval_s)

    def _live(self, found: dict[Path, tuple[ModelRecord, str]]) -> dict[str, ModelRecord]:
        """The records whose lease holds (or that have none), by instance id."""
        now = self._clock()
        for path in [p for p in self._sightings if p not in found]:
            del self._sightings[path]
        live: dict[str, ModelRecord] = {}
        for path, (record, text) in found.items():
            sighting = self._sightings.get(path)
            if sighting is None or sighting.text != text:
                if sighting is not None and sighting.expired:
                    logger.info("Discovery record %s renewed after it expired", path)
                sighting = self._sightings[path] = _Sighting(text, changed_at=now)
            if record.has_lease and self._expired(path, record, sighting, now):
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

    async def poll_once(self) -> None:
        current = self._live(self._scan())
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
        except Exception:  # noqa: BLE001 - see class docstring
            logger.exception("Discovery callback failed for %s (%s)", record.model, record.endpoint)

    async def run(self) -> None:
        while True:
            await self.poll_once()
            await asyncio.sleep(self.poll_interval_s)

    def start(self) -> asyncio.Task:
        self._task = asyncio.get_running_loop().create_task(self.run(), name="discovery-watcher")
        return self._task

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None
