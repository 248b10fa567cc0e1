"""The file store's writer side: one JSON file per record, replaced atomically; and the checks a
process runs on the directory before it starts (created, listable, writable for a worker)."""

from __future__ import annotations

import dataclasses
import getpass
import logging
import os
import stat as stat_module
import tempfile
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
        renewed = dataclasses.replace(record, heartbeat=(record.heartbeat or 0) + 1)
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


def default_directory_base() -> str:
    """Where the per-user default discovery directory lives: $XDG_RUNTIME_DIR (this user's own,
    mode 0700, set by the session), else the temp directory (everyone's)."""
    return os.environ.get("XDG_RUNTIME_DIR") or tempfile.gettempdir()


def default_discovery_dir() -> str:
    """Per user, so two users on one host never see each other's workers:
    ``$XDG_RUNTIME_DIR/dynamo/discovery``, else ``<tmpdir>/dynamo-<user>/discovery``."""
    if os.environ.get("XDG_RUNTIME_DIR"):
        return os.path.join(default_directory_base(), "dynamo", "discovery")
    try:
        user = getpass.getuser()
    except Exception:  # noqa: BLE001 - no passwd entry in some containers
        user = str(os.getuid())
    return os.path.join(default_directory_base(), f"dynamo-{user}", "discovery")


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


def check_private_directory(directory: str | os.PathLike, base: str | os.PathLike) -> Path:
    """Create ``directory`` below ``base`` as this user's own, or prove it is; return it.

    For the default discovery directory, which nobody chose: it lives under a place every user
    can write in (the temp directory), so another user could have created it first, or made it
    writable to all, and then put records in it (records are peers' words: a model served from
    their files, requests routed to their address). Each component below ``base`` is created
    with mode 0700 when missing, and must be a real directory (not a symbolic link) owned by this
    user and not writable by group or others; else :class:`DiscoveryDirError` says which and
    why. ``base`` itself (the temp directory, $XDG_RUNTIME_DIR) is the system's.
    """
    base_path, path = Path(base), Path(directory)
    try:
        parts = path.relative_to(base_path).parts
    except ValueError:
        raise DiscoveryDirError(f"{path} is not under {base_path}") from None
    uid = os.geteuid()
    current = base_path
    for part in parts:
        current = current / part
        try:
            os.mkdir(current, 0o700)
        except FileExistsError:
            pass
        except OSError as exc:
            raise DiscoveryDirError(f"cannot create {current}: {exc.strerror or exc}") from None
        status = os.lstat(current)
        if stat_module.S_ISLNK(status.st_mode):
            problem = "is a symbolic link"
        elif not stat_module.S_ISDIR(status.st_mode):
            problem = "is not a directory"
        elif status.st_uid != uid:
            problem = f"belongs to uid {status.st_uid}, not to this user (uid {uid})"
        elif status.st_mode & 0o022:
            problem = f"is writable by other users (mode {stat_module.S_IMODE(status.st_mode):o})"
        else:
            continue
        raise DiscoveryDirError(
            f"{current} {problem}: another user could put discovery records there"
        )
    return path


def writable_by_others(directory: str | os.PathLike) -> bool:
    """Whether users other than the directory's owner and group can write in it (an explicitly
    chosen directory is the operator's call; this only warrants a WARNING)."""
    try:
        mode = os.stat(directory).st_mode
    except OSError:
        return False
    return bool(mode & 0o002) and not mode & stat_module.S_ISVTX
