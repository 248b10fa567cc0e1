"""Model discovery through a shared directory: one JSON record per registered model instance.

Workers write ``<instance_id>.json`` atomically (temp file in the same directory, then
``os.replace``), so a reader sees either no record or a whole one. The frontend's
:class:`DiscoveryWatcher` polls the directory and reports records appearing and disappearing.
A half-written or malformed record is skipped with one WARNING (per file version), never a crash.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Awaitable, Callable

logger = logging.getLogger(__name__)

RECORD_SUFFIX = ".json"


@dataclass(frozen=True)
class ModelRecord:
    """One registered model instance: which model, and where its request plane listens."""

    model: str
    endpoint: str  # base URL of the worker's request plane, e.g. http://127.0.0.1:40123
    instance_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    pid: int = field(default_factory=os.getpid)
    registered_at: float = field(default_factory=time.time)

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

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
            )
        except KeyError as exc:
            raise ValueError(f"record lacks field {exc.args[0]!r}") from None
        except TypeError as exc:  # e.g. "pid": null, "registered_at": {}
            raise ValueError(f"record has a field of the wrong type: {exc}") from None
        for name in ("model", "endpoint", "instance_id"):
            value = getattr(record, name)
            if not isinstance(value, str) or not value:
                raise ValueError(f"record field {name!r} must be a non-empty string")
        return record


class DiscoveryStore:
    """The writer side, used by workers."""

    def __init__(self, directory: str | os.PathLike) -> None:
        self.directory = Path(directory)

    def path_for(self, instance_id: str) -> Path:
        return self.directory / f"{instance_id}{RECORD_SUFFIX}"

    def register(self, record: ModelRecord) -> Path:
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.path_for(record.instance_id)
        fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=".tmp-", suffix=".part")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write(record.to_json())
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


class DiscoveryWatcher:
    """Polls the discovery directory and reports added and removed records.

    ``on_add`` / ``on_remove`` may be plain functions or coroutines; an exception in one is
    logged and the watcher keeps going (one bad model must not blind the frontend to the rest).
    """

    def __init__(
        self,
        directory: str | os.PathLike,
        *,
        on_add: RecordCallback,
        on_remove: RecordCallback,
        poll_interval_s: float = 0.2,
    ) -> None:
        self.directory = Path(directory)
        self.on_add = on_add
        self.on_remove = on_remove
        self.poll_interval_s = poll_interval_s
        self.known: dict[str, ModelRecord] = {}
        # path -> (mtime_ns, size) of files already reported as malformed, to warn once each
        self._bad: dict[Path, tuple[int, int]] = {}
        self._task: asyncio.Task | None = None

    def _scan(self) -> dict[str, ModelRecord]:
        found: dict[str, ModelRecord] = {}
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
            found[record.instance_id] = record
        for path in list(self._bad):
            if path not in seen_bad:
                del self._bad[path]
        return found

    async def poll_once(self) -> None:
        current = self._scan()
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
