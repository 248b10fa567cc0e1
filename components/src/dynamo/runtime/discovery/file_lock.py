"""The file store's GC maintenance lock: one file per model, created exclusively, renewed while
held, stale after the TTL on the reader's clock.

``<directory>/.maintenance-<digest of the model name>.lock`` (a dot-file: watchers never read
it as a record). Taking it is ``open(O_CREAT | O_EXCL)``: of two workers that try at once,
exactly one creates it. The holder keeps the file open and rewrites its content in place every
fifth of the TTL (a counter), so a reader sees it change. Each taking writes a token of its own:
a holder that lets go and takes the lock again within the TTL (a worker maintained at every
cycle) makes a new file that file systems like ext4 give the inode just freed, and without the
token it would read as the same file unchanged since the first taking, and be broken while
held. The token is also how a holder knows the file at the path is still its own.

A worker that finds the lock held remembers what it read and when, on its own monotonic clock,
as the watchers judge records: a lock whose content has not changed for longer than the TTL
belongs to a holder that died (or stalled that long), and is broken.

Breaking is safe against a second breaker and a late renewal: the stale file is renamed away to
a name of the breaker's own (atomic), and only if what was renamed is still the very file judged
stale (same inode and content) is it deleted and the lock taken by a new exclusive create;
otherwise the file is put back where it was with ``link`` (which fails rather than replace a
newer lock). A holder whose file was broken sees it (:meth:`held`: the path no longer names the
file it has open with its token) before it collects.

Every file-system call runs off the event loop (a network volume can block).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from dynamo.runtime.discovery.periodic import PeriodicTask, run_off_loop
from dynamo.runtime.discovery.record_files import content_digest, read_record_file
from dynamo.runtime.peer_text import escape

logger = logging.getLogger(__name__)

LOCK_PREFIX = ".maintenance-"
LOCK_SUFFIX = ".lock"
RENEWALS_PER_TTL = 5


def lock_path(directory: str | os.PathLike, model: str) -> Path:
    """Where the lock of ``model`` lives (a digest: a model name can hold any character)."""
    digest = hashlib.sha256(model.encode("utf-8", "surrogatepass")).hexdigest()[:32]
    return Path(directory) / f"{LOCK_PREFIX}{digest}{LOCK_SUFFIX}"


@dataclass
class _Sighting:
    """Another holder's lock file as this process last read it, and since when (its clock)."""

    inode: int
    digest: bytes
    since: float


class FileMaintenanceLock:
    """The lock of one model, taken by one instance (see the module docstring)."""

    def __init__(
        self,
        directory: str | os.PathLike,
        model: str,
        instance_id: str,
        *,
        ttl_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path = lock_path(directory, model)
        self.instance_id = instance_id
        self.ttl_s = ttl_s
        self._clock = clock
        self._fd: int | None = None
        self._beat = 0
        self._token = ""  # this taking's own (see the module docstring)
        self._seen: _Sighting | None = None
        self._renewal: PeriodicTask | None = None

    # -- taking and breaking (in a thread) ----------------------------------------------------

    def _content(self) -> bytes:
        return json.dumps(
            {"instance_id": self.instance_id, "taken": self._token, "beat": self._beat}
        ).encode()

    def _create(self) -> bool:
        try:
            fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_CLOEXEC, 0o644)
        except FileExistsError:
            return False
        self._beat = 0
        self._token = uuid.uuid4().hex
        os.write(fd, self._content())
        self._fd = fd
        self._seen = None
        return True

    def _stale(self) -> bool:
        """Whether the lock file there now has been unchanged for longer than the TTL, as this
        process has watched it; False when it is gone (the next create decides)."""
        try:
            read = read_record_file(self.path)
        except FileNotFoundError:
            return False
        if isinstance(read, str):  # not a regular file: never ours to break
            return False
        key, raw = read
        inode, digest, now = key[0], content_digest(raw), self._clock()
        seen = self._seen
        if seen is None or (seen.inode, seen.digest) != (inode, digest):
            self._seen = _Sighting(inode, digest, now)
            return False
        return now - seen.since > self.ttl_s

    def _break(self) -> bool:
        """Remove the stale lock file judged by :meth:`_stale`; False when it changed since."""
        seen = self._seen
        assert seen is not None
        aside = self.path.with_name(f"{self.path.name}.broken-{uuid.uuid4().hex}")
        try:
            os.rename(self.path, aside)
        except FileNotFoundError:
            return True  # someone else broke it (or its holder released it): try to create
        try:
            read = read_record_file(aside)
            same = not isinstance(read, str) and (read[0][0], content_digest(read[1])) == (
                seen.inode,
                seen.digest,
            )
            if not same:
                try:
                    os.link(aside, self.path)  # a live lock renamed by mistake: put it back
                except FileExistsError:
                    pass  # a newer lock is there already; the one moved aside sees it lost
                return False
        finally:
            os.unlink(aside)
        logger.warning(
            "GC maintenance lock %s was stale (unchanged for over %g s): broken",
            escape(self.path, 300),
            self.ttl_s,
        )
        self._seen = None
        return True

    def _try_acquire(self) -> bool:
        if self._create():
            return True
        if self._stale() and self._break():
            return self._create()
        return False

    def _renew(self) -> None:
        fd = self._fd
        if fd is None:
            return
        self._beat += 1
        content = self._content()
        os.pwrite(fd, content, 0)
        os.ftruncate(fd, len(content))

    def _owns_path(self, fd: int) -> bool:
        """Whether the file at the path is the one this taking opened: the same inode and this
        taking's token (an inode number alone is reused once a broken file is deleted)."""
        try:
            read = read_record_file(self.path)
        except FileNotFoundError:
            return False
        if isinstance(read, str) or read[0][0] != os.fstat(fd).st_ino:
            return False
        try:
            return json.loads(read[1]).get("taken") == self._token
        except (ValueError, AttributeError):
            return False

    def _holds(self) -> bool:
        fd = self._fd
        return fd is not None and self._owns_path(fd)

    def _let_go(self) -> None:
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            if self._owns_path(fd):
                os.unlink(self.path)
        except FileNotFoundError:
            pass
        finally:
            os.close(fd)

    # -- the lock (on the loop) ---------------------------------------------------------------

    async def acquire(self) -> bool:
        try:
            taken = await run_off_loop(self._try_acquire)
        except OSError as exc:
            logger.warning("GC maintenance lock %s cannot be taken: %s", self.path, exc)
            return False
        if taken:
            self._renewal = PeriodicTask(
                "gc-maintenance-lock",
                self.ttl_s / RENEWALS_PER_TTL,
                lambda: run_off_loop(self._renew),
                delay_first=True,
            )
            self._renewal.start()
        return taken

    async def held(self) -> bool:
        try:
            return await run_off_loop(self._holds)
        except OSError:
            return False

    async def release(self) -> None:
        renewal, self._renewal = self._renewal, None
        if renewal is not None:
            await renewal.stop()
        try:
            await asyncio.shield(run_off_loop(self._let_go))
        except OSError as exc:  # the file is left to go stale; peers break it after the TTL
            logger.warning("GC maintenance lock %s not removed: %s", self.path, exc)

    async def close(self) -> None:
        await self.release()
