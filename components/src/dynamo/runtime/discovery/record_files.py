"""Reading one record file of the file store, safely: whoever can write in the directory can put
anything there (a FIFO, a device, a symbolic link, a file that grows while it is read).

A record file is opened without following a symbolic link and without blocking, checked again
on what was opened (a regular file, at most MAX_RECORD_BYTES), and read to at most one byte past
the limit. What a watcher remembers of it is its stat key and a digest, not its text.
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat as stat_module
from pathlib import Path

from dynamo.runtime.discovery.record import MAX_RECORD_BYTES

StatKey = tuple[int, int, int]


def too_large(size: int) -> str:
    return f"{size} bytes or more, over the {MAX_RECORD_BYTES}-byte record limit (not read)"


def stat_key(result: os.stat_result) -> StatKey:
    return (result.st_ino, result.st_mtime_ns, result.st_size)


# A record file is opened without following a symbolic link, without blocking (a FIFO opens at
# once instead of waiting for a writer), and never as a controlling terminal.
_OPEN_FLAGS = (
    os.O_RDONLY
    | os.O_NONBLOCK
    | getattr(os, "O_NOFOLLOW", 0)
    | getattr(os, "O_NOCTTY", 0)
    | getattr(os, "O_CLOEXEC", 0)
)


def read_record_file(path: Path) -> tuple[StatKey, bytes] | str:
    """The stat key and content of a regular file of at most MAX_RECORD_BYTES, or why ``path``
    is not one. What was checked with a stat can be swapped before the open (a FIFO or a device
    behind a rename or a symlink): the open cannot block and the check is made again on what was
    opened. Raises OSError for a file that cannot be read (unknown, not malformed)."""
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return "a symbolic link (not followed)"
        raise
    try:
        status = os.fstat(fd)
        if not stat_module.S_ISREG(status.st_mode):
            return "not a regular file"
        chunks, size = [], 0
        while size <= MAX_RECORD_BYTES:  # it may have grown since the stat
            chunk = os.read(fd, MAX_RECORD_BYTES + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    finally:
        os.close(fd)
    if size > MAX_RECORD_BYTES:
        return too_large(size)
    return stat_key(status), b"".join(chunks)


def content_digest(raw: bytes) -> bytes:
    # What a watcher remembers of a file's content: enough to see it change, not the content
    # (thousands of records held twice as text would be the frontend's memory, not theirs).
    return hashlib.blake2b(raw, digest_size=16).digest()
