"""The file store's writer side: one JSON file per record, replaced atomically; and the checks a
process runs on the directory before it starts (created, listable, writable for a worker)."""

from __future__ import annotations

import dataclasses
import logging
import os
import tempfile
import time
from pathlib import Path

from dynamo.runtime.discovery.interface import (
    DiscoveryDirError,
)
from dynamo.runtime.discovery.record import (
    ModelRecord,
)

logger = logging.getLogger(__name__)

RECORD_SUFFIX = ".json"


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
